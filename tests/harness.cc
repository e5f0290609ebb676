// Multi-rank test harness (see harness.h).
#include "harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_TEST_LSAN 1
#endif
#endif
#ifdef CHORUS_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace chorus::test {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ShellResult run_shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    r.output = "popen failed: " + cmd;
    return r;
  }
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

namespace {

// Whether `pid` has ended, its status in *st (as waitpid's); with `keep`, left unreaped.
bool ended(pid_t pid, bool keep, int* st) {
  if (!keep) return waitpid(pid, st, WNOHANG) == pid;
  siginfo_t info{};
  if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid)
    return false;
  *st = info.si_code == CLD_EXITED ? W_EXITCODE(info.si_status, 0) : info.si_status;
  return true;
}

}  // namespace

RankBarrier::RankBarrier(int n) : n_(n) {
  shared_ = mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared_ == MAP_FAILED) throw std::runtime_error("RankBarrier: mmap failed");
  new (shared_) std::atomic<int>(0);
}

RankBarrier::~RankBarrier() {
  munmap(shared_, sizeof(std::atomic<int>));
}

bool RankBarrier::arrive_and_wait(double seconds) {
  auto* all = static_cast<std::atomic<int>*>(shared_);
  all->fetch_add(1);
  const int want = ++mine_ * n_;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (all->load() < want) {
    if (std::chrono::steady_clock::now() > end) return false;
    usleep(1000);
  }
  return true;
}

std::vector<RankResult> run_ranks(int n, const std::function<int(int)>& fn, const RunOptions& opt) {
  int port = opt.port ? opt.port : free_port();
  std::vector<pid_t> pids(n);
  std::vector<std::string> logs(n);
  auto start = std::chrono::steady_clock::now();
  std::fflush(nullptr);
  for (int r = 0; r < n; ++r) {
    char path[] = "/tmp/chorus-test-XXXXXX";
    int fd = mkstemp(path);
    logs[r] = path;
    pid_t pid = fork();
    if (pid == 0) {
      // A rank must not outlive the test (a killed test leaves no orphans), and must not run
      // Catch's fatal-signal handlers, inherited from the parent (they allocate).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (int sig : {SIGSEGV, SIGABRT, SIGTERM, SIGINT, SIGILL, SIGFPE, SIGBUS, SIGPIPE})
        signal(sig, SIG_DFL);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(opt.world_size > 0 ? opt.world_size : n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!std::getenv("CHORUS_TIMEOUT")) setenv("CHORUS_TIMEOUT", "30", 1);
      for (auto& [k, v] : opt.env) setenv(k.c_str(), v.c_str(), 1);
      int rc = 1;
      try {
        rc = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", r, e.what());
      }
#ifdef CHORUS_TEST_LSAN
      // _exit skips LeakSanitizer's check at exit: run it here, so a rank's leaks fail its test.
      if (__lsan_do_recoverable_leak_check() != 0 && rc == 0) rc = 1;
#endif
      std::fflush(nullptr);
      _exit(rc);
    }
    close(fd);
    pids[r] = pid;
  }
  std::vector<RankResult> out(n);
  std::vector<pid_t> zombies;  // with opt.reap_last: ended, reaped after the last
  int left = n;
  bool over = false;
  while (left > 0) {
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    over = el > opt.limit_seconds;
    for (int r = 0; r < n; ++r) {
      if (pids[r] == 0) continue;
      int st = 0;
      if (!ended(pids[r], opt.reap_last, &st)) {
        if (!over) continue;
        // Past the limit: a rank still running is hung. SIGKILL ends it; reap it with a bounded
        // wait.
        kill(pids[r], SIGKILL);
        for (int i = 0; i < 1000 && waitpid(pids[r], &st, WNOHANG) != pids[r]; ++i) usleep(1000);
        out[r].exit_code = -SIGKILL;
        char note[96];
        std::snprintf(note, sizeof note,
                      "[harness: killed after the time limit of %.0f s: a hang]\n",
                      opt.limit_seconds);
        out[r].output += note;
      } else {
        out[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        if (opt.reap_last) zombies.push_back(pids[r]);
      }
      out[r].seconds = el;
      pids[r] = 0;
      --left;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t pid : zombies) waitpid(pid, nullptr, 0);
  for (int r = 0; r < n; ++r) {
    std::ifstream f(logs[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].output = ss.str() + out[r].output;
    unlink(logs[r].c_str());
  }
  return out;
}

}  // namespace chorus::test
