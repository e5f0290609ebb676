// A worker for the chorus-run tests: does one thing chosen by argv[1], per rank ($RANK).
//   env                      print the launcher's variables as KEY=value lines
//   lines N                  N lines "out i" on stdout and "err i" on stderr, then "tail" with no
//   newline sleep                    print "ready pid=P", sleep 30 s; on SIGTERM/SIGINT print "got
//   signal S", exit 1 fail-rank R CODE         rank R exits with CODE after 0.3 s; the others do
//   "sleep" signal-rank R SIG        rank R raises SIG after 0.3 s; the others do "sleep"
//   ignore-term-rank R       rank R exits 1 after 0.5 s; the others ignore SIGTERM and sleep
//   fail-first-attempt R     print "restart=C port=P secret=S"; rank R exits 4 when C is 0
//   always-fail R CODE       rank R exits with CODE; the others exit 0
//   background               leave a child sleeping 20 s with our stdout/stderr; print "pgid=G";
//   exit 0
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}

void sleep_s(double seconds) {
  timespec ts{static_cast<time_t>(seconds),
              static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void on_stop(int sig) {
  char msg[32];
  int n = std::snprintf(msg, sizeof(msg), "got signal %d\n", sig);
  (void)!write(STDOUT_FILENO, msg, n);
  _exit(1);
}

int do_sleep() {
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  std::printf("ready pid=%d\n", getpid());
  std::fflush(stdout);
  sleep_s(30);
  return 0;
}

int do_env() {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CHORUS_JOB_SECRET",
                           "CHORUS_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    std::printf("%s=%s\n", name, env(name).c_str());
  }
  return 0;
}

int do_lines(long n) {
  for (long i = 0; i < n; ++i) {
    std::printf("out %ld\n", i);
    if (i % 10 == 0) std::fprintf(stderr, "err %ld\n", i);
  }
  std::printf("tail");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string mode = argv[1];
  int rank = std::atoi(env("RANK").c_str());
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  int value = argc > 3 ? std::atoi(argv[3]) : 0;
  if (mode == "env") return do_env();
  if (mode == "lines") return do_lines(std::atol(argv[2]));
  if (mode == "sleep") return do_sleep();
  if (mode == "fail-rank" || mode == "signal-rank") {
    if (rank != target) return do_sleep();
    sleep_s(0.3);
    if (mode == "signal-rank") raise(value);
    return value;
  }
  if (mode == "ignore-term-rank") {
    if (rank != target) {
      signal(SIGTERM, SIG_IGN);
      sleep_s(30);
      return 0;
    }
    sleep_s(0.5);
    return 1;
  }
  if (mode == "fail-first-attempt") {
    std::string count = env("CHORUS_RESTART_COUNT");
    std::printf("restart=%s elastic=%s port=%s secret=%s\n", count.c_str(),
                env("TORCHELASTIC_RESTART_COUNT").c_str(), env("MASTER_PORT").c_str(),
                env("CHORUS_JOB_SECRET").c_str());
    return rank == target && count == "0" ? 4 : 0;
  }
  if (mode == "always-fail") return rank == target ? value : 0;
  if (mode == "background") {
    if (fork() == 0) {
      sleep_s(20);
      _exit(0);
    }
    std::printf("pgid=%d\n", static_cast<int>(getpgrp()));
    return 0;
  }
  return 64;
}
