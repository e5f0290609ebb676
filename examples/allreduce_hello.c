/* allreduce_hello: chorus from plain C11, the way an embedding framework uses it.
 *
 * Joins the job from the launcher's variables, sums an int32 array in place and averages a
 * float array out of place across every rank, checks every element, prints one line per rank
 * and leaves. Any failure prints the library's own message and exits 1.
 *
 *   chorus-run -n 2 build/examples/allreduce_hello
 *   cc allreduce_hello.c $(pkg-config --cflags --libs chorus) -o hello   # against an install
 */
#include <chorus/chorus.h>
#include <stdint.h>
#include <stdio.h>

#define COUNT 1000

/* Prints what failed and returns 1 from main when a chorus call does not succeed. */
#define CHECK(call)                                                                             \
  do {                                                                                          \
    chorusResult_t rc_ = (call);                                                                \
    if (rc_ != chorusSuccess) {                                                                 \
      fprintf(stderr, "allreduce_hello: %s failed: %s: %s\n", #call, chorusGetErrorString(rc_), \
              chorusGetLastError(comm));                                                        \
      if (comm != NULL) chorusCommAbort(comm);                                                  \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

int main(void) {
  chorusComm_t comm = NULL;
  int rank = -1, nranks = 0;
  CHECK(chorusCommInitFromEnv(&comm));
  CHECK(chorusCommUserRank(comm, &rank));
  CHECK(chorusCommCount(comm, &nranks));

  /* Rank r holds ints[i] = r + i and floats[i] = 2r + i % 7 (small integers, exact in float). */
  static int32_t ints[COUNT];
  static float floats[COUNT], avg[COUNT];
  for (int i = 0; i < COUNT; ++i) {
    ints[i] = rank + i;
    floats[i] = (float)(2 * rank + i % 7);
  }
  CHECK(chorusAllReduce(ints, ints, COUNT, chorusInt32, chorusSum, comm, NULL));
  CHECK(chorusAllReduce(floats, avg, COUNT, chorusFloat32, chorusAvg, comm, NULL));

  /* sum over r of (r + i) = n*i + n(n-1)/2; mean over r of (2r + i % 7) = (n-1) + i % 7. */
  int wrong_ints = 0, wrong_floats = 0;
  for (int i = 0; i < COUNT; ++i) {
    const int32_t want_int = nranks * i + nranks * (nranks - 1) / 2;
    const float want_avg = (float)(nranks - 1 + i % 7);
    const float diff = avg[i] > want_avg ? avg[i] - want_avg : want_avg - avg[i];
    wrong_ints += ints[i] != want_int;
    wrong_floats += !(diff <= 1e-5f * (want_avg > 1.0f ? want_avg : 1.0f));
  }
  printf("rank %d of %d: int32 sum %s, float avg %s (%d elements each)\n", rank, nranks,
         wrong_ints ? "WRONG" : "ok", wrong_floats ? "WRONG" : "ok", COUNT);
  fflush(stdout);
  if (wrong_ints || wrong_floats) {
    fprintf(stderr, "allreduce_hello: rank %d: %d int32 and %d float elements wrong\n", rank,
            wrong_ints, wrong_floats);
    chorusCommAbort(comm);
    return 1;
  }
  CHECK(chorusCommDestroy(comm));
  return 0;
}
