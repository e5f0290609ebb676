/* Under chorus-run --elastic: rank VICTIM (argv[1]) kills itself (SIGKILL) after the first
 * all-reduce; the others run all-reduces until one fails, shrink with CHORUS_SHRINK_AGREE (the
 * library finds the dead rank and every survivor agrees), and check three all-reduces on the
 * smaller communicator. Prints "rank R: continued as rank r of n" and exits 0 on success. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <chorus/chorus.h>

/* One all-reduce of `n` floats, each rank adding rank + 1; checks the sum. 0: right. */
static int all_reduce(chorusComm_t comm, int* failed) {
  int rank = 0, size = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &size);
  float v[1000];
  for (int i = 0; i < 1000; ++i) v[i] = (float)(rank + 1);
  chorusResult_t rc = chorusAllReduce(v, v, 1000, chorusFloat32, chorusSum, comm, NULL);
  if (rc != chorusSuccess) {
    *failed = 1;
    fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, chorusGetLastError(comm));
    return 0;
  }
  *failed = 0;
  return v[0] != (float)(size * (size + 1) / 2) || v[999] != v[0];
}

int main(int argc, char** argv) {
  const int victim = argc > 1 ? atoi(argv[1]) : 0;
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    fprintf(stderr, "init failed: %s\n", chorusGetLastError(NULL));
    return 2;
  }
  int rank = -1, size = 0, failed = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &size);
  /* The first may fail already on the others: the victim leaves it as soon as it has its own
   * result, and may be dead before a peer has taken its last pieces. */
  if (all_reduce(comm, &failed) || (failed && rank == victim)) return 3;
  if (rank == victim) kill(getpid(), SIGKILL);
  for (int i = 0; i < 1000 && !failed; ++i)
    if (all_reduce(comm, &failed)) return 4;
  if (!failed) return 5;
  chorusComm_t small;
  if (chorusCommShrink(comm, NULL, 0, &small, NULL, CHORUS_SHRINK_AGREE) != chorusSuccess) {
    fprintf(stderr, "rank %d: shrink failed: %s\n", rank, chorusGetLastError(comm));
    return 6;
  }
  int new_rank = -1, new_size = 0;
  chorusCommUserRank(small, &new_rank);
  chorusCommCount(small, &new_size);
  for (int i = 0; i < 3; ++i)
    if (all_reduce(small, &failed) || failed) return 7;
  printf("rank %d: continued as rank %d of %d\n", rank, new_rank, new_size);
  fflush(stdout);
  chorusCommDestroy(small);
  chorusCommDestroy(comm);
  return new_size == size - 1 ? 0 : 8;
}
