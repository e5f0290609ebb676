// recovery-bench: time from a kill -9 to the survivors' next completed step (issue 17 item 6).
//
// W ranks (forked here, one host, shm) run "steps" of a 1 MiB f32 all-reduce. At step 20 the
// victim rank writes the time and kills itself; the survivors see their all-reduce fail,
// shrink with CHORUS_SHRINK_AGREE (they find and agree on the dead rank themselves) and run the
// next step on the new communicator. The bootstrap store lives in a process of its own (the
// unique-id path: whoever calls chorusGetUniqueId hosts it), so rank 0 can be the victim too.
// With "failover", rank 0 hosts the store and is always the victim: the survivors first move to
// a new store hosted by one of them (collectives/failover.cc), inside the shrink's time.
// Prints per (W, victim) the recovery time (kill -> next step done) and its parts, then the
// median per W. Usage: recovery-bench [repeats per W, default 5] [failover].
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Report {
  double kill, detected, shrunk, stepped;
};

int rank_main(int w, int rank, int victim, const chorusUniqueId& id, int out_fd) {
  chorusComm_t comm = nullptr;
  if (chorusCommInitRank(&comm, w, id, rank) != chorusSuccess) return 10;
  const size_t n = 1 << 18;
  std::vector<float> buf(n, 1.0f);
  Report r{};
  if (rank == victim) {
    for (int step = 0; step < 20; ++step)
      if (chorusAllReduce(buf.data(), buf.data(), n, chorusFloat32, chorusSum, comm, nullptr) !=
          chorusSuccess)
        return 11;
    r.kill = now();
    if (write(out_fd, &r, sizeof r) != sizeof r) return 12;
    raise(SIGKILL);
  }
  // Steps until one fails: the victim is gone (a survivor may be inside its 20th step then).
  while (chorusAllReduce(buf.data(), buf.data(), n, chorusFloat32, chorusSum, comm, nullptr) ==
         chorusSuccess) {
  }
  r.detected = now();
  chorusComm_t small = nullptr;
  if (chorusCommShrink(comm, nullptr, 0, &small, nullptr, CHORUS_SHRINK_AGREE) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: shrink: %s\n", rank, chorusGetLastError(comm));
    return 13;
  }
  r.shrunk = now();
  if (chorusAllReduce(buf.data(), buf.data(), n, chorusFloat32, chorusSum, small, nullptr) !=
      chorusSuccess)
    return 14;
  r.stepped = now();
  int new_rank = -1;
  chorusCommUserRank(small, &new_rank);
  if (new_rank == 0 && write(out_fd, &r, sizeof r) != sizeof r) return 15;
  chorusCommDestroy(small);
  chorusCommDestroy(comm);
  return 0;
}

// One run: the store's process (or rank 0 hosts it), W ranks, one victim. Recovery in seconds,
// or -1.
double run_once(int w, int victim, bool store_in_rank0, Report* parts) {
  int idp[2], rp[2];
  if (pipe(idp) != 0 || pipe(rp) != 0) return -1;
  pid_t store = -1;
  std::vector<pid_t> kids;
  if (store_in_rank0) {  // rank 0 makes the id, hands it to the others, and joins
    pid_t p = fork();
    if (p == 0) {
      chorusUniqueId id;
      if (chorusGetUniqueId(&id) != chorusSuccess) _exit(1);
      for (int r = 1; r < w; ++r)
        if (write(idp[1], &id, sizeof id) != sizeof id) _exit(1);
      _exit(rank_main(w, 0, victim, id, rp[1]));
    }
    kids.push_back(p);
  } else {
    store = fork();
    if (store == 0) {
      chorusUniqueId id;
      if (chorusGetUniqueId(&id) != chorusSuccess) _exit(1);
      if (write(idp[1], &id, sizeof id) != sizeof id) _exit(1);
      pause();
      _exit(0);
    }
  }
  chorusUniqueId id;
  if (!store_in_rank0 && read(idp[0], &id, sizeof id) != sizeof id) return -1;
  for (int r = store_in_rank0 ? 1 : 0; r < w; ++r) {
    if (store_in_rank0 && read(idp[0], &id, sizeof id) != sizeof id) return -1;
    pid_t p = fork();
    if (p == 0) _exit(rank_main(w, r, victim, id, rp[1]));
    kids.push_back(p);
  }
  close(rp[1]);
  Report dead{}, survivor{};
  bool ok = read(rp[0], &dead, sizeof dead) == sizeof dead &&
            read(rp[0], &survivor, sizeof survivor) == sizeof survivor;
  for (pid_t p : kids) waitpid(p, nullptr, 0);
  if (store > 0) {
    ::kill(store, SIGKILL);
    waitpid(store, nullptr, 0);
  }
  close(rp[0]);
  close(idp[0]);
  close(idp[1]);
  if (!ok) return -1;
  *parts = survivor;
  parts->kill = dead.kill;
  return survivor.stepped - dead.kill;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const bool failover = argc > 2 && std::string(argv[2]) == "failover";
  setenv("CHORUS_TIMEOUT", "30", 0);
  if (failover) std::printf("rank 0 hosts the store and dies: the survivors move to a new one\n");
  std::printf("%3s %6s %12s %12s %12s %12s\n", "W", "victim", "recovery ms", "detect ms",
              "shrink ms", "step ms");
  for (int w : {3, 4}) {
    std::vector<double> all;
    for (int i = 0; i < repeats; ++i) {
      const int victim = failover ? 0 : i % w;
      Report p{};
      double t = run_once(w, victim, failover, &p);
      if (t < 0) {
        std::printf("%3d %6d failed\n", w, victim);
        return 1;
      }
      all.push_back(t);
      std::printf("%3d %6d %12.1f %12.1f %12.1f %12.1f\n", w, victim, t * 1e3,
                  (p.detected - p.kill) * 1e3, (p.shrunk - p.detected) * 1e3,
                  (p.stepped - p.shrunk) * 1e3);
    }
    std::sort(all.begin(), all.end());
    std::printf("W=%d: median recovery %.1f ms over %d runs (max %.1f ms)\n", w,
                all[all.size() / 2] * 1e3, repeats, all.back() * 1e3);
  }
  return 0;
}
