/* Rank 0, which hosts the bootstrap store, dies (SIGKILL) after the first barrier; every other
 * rank must fail its second barrier within 5 s with an error that names rank 0 and the call.
 * SIGTERM is ignored so that a launcher stopping the job cannot cut the survivors short of
 * their report (the launcher's SIGKILL still ends them). Prints "rank R: ok" on success. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <chorus/chorus.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  signal(SIGTERM, SIG_IGN);
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    fprintf(stderr, "init failed: %s\n", chorusGetLastError(NULL));
    return 2;
  }
  int rank = -1;
  chorusCommUserRank(comm, &rank);
  if (chorusBarrier(comm, NULL) != chorusSuccess) return 3;
  if (rank == 0) {
    usleep(300000);
    kill(getpid(), SIGKILL);
  }
  double t0 = now();
  chorusResult_t rc = chorusBarrier(comm, NULL);
  double took = now() - t0;
  const char* msg = chorusGetLastError(comm);
  char call[64];
  snprintf(call, sizeof call, "barrier #2 on rank %d", rank);
  printf("rank %d: %s after %.2f s: %s\n", rank, chorusGetErrorString(rc), took, msg);
  int ok = rc == chorusRemoteError && strstr(msg, "rank 0 (pid ") && strstr(msg, "died") &&
           strstr(msg, call) && took <= 5.0;
  printf("rank %d: %s\n", rank, ok ? "ok" : "FAIL");
  fflush(stdout);
  return ok ? 0 : 1;
}
