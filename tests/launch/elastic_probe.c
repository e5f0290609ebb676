/* Under chorus-run --elastic, or ranks started by hand: the ranks listed in argv[1] ("0", or
 * "0,1") kill themselves (SIGKILL) after the first all-reduce; the others run all-reduces until
 * one fails, shrink with CHORUS_SHRINK_AGREE (the library finds the dead ranks and every
 * survivor agrees; when the store's host is among them, on the store that took over), and check
 * three all-reduces on the smaller communicator. Prints "rank R: continued as rank r of n" and
 * exits 0 on success. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Is `rank` in the comma list `victims`? */
static int is_victim(const char* victims, int rank) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", victims);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
    if (atoi(tok) == rank) return 1;
  return 0;
}

int main(int argc, char** argv) {
  const char* victims = argc > 1 ? argv[1] : "0";
  int nvictims = 1;
  for (const char* c = victims; *c; ++c) nvictims += *c == ',';
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    fprintf(stderr, "init failed: %s\n", chorusGetLastError(NULL));
    return 2;
  }
  int rank = -1, size = 0, failed = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &size);
  /* The first may fail already: a victim leaves it as soon as it has its own result, and may
   * be dead before a peer has taken its last pieces. */
  const int victim = is_victim(victims, rank);
  if (all_reduce(comm, &failed)) return 3; /* a wrong sum */
  if (victim) kill(getpid(), SIGKILL);
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
  return new_size == size - nvictims ? 0 : 8;
}
