// Descriptor passing between processes (transport/fd_pass.h), as the CUDA IPC link will pass
// cuMem allocations: real processes, memfds standing in for device memory.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "transport/fd_pass.h"

using namespace chorus;
using namespace chorus::transport;

namespace {

size_t open_fds() {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) (void)e, ++n;
  return n;
}

std::string unique_name(const char* what) {
  return std::string("test-") + what + "-" + std::to_string(getpid());
}

// A child that connects to `name` after `delay_us`, passes a memfd holding `text` with tag 42,
// and waits for one byte back before it exits (so its descriptor outlives the transfer).
pid_t passing_child(const std::string& name, const std::string& text, int delay_us) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  usleep(delay_us);
  int mem = memfd_create("chorus-test", MFD_CLOEXEC);
  if (mem < 0 || write(mem, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    _exit(2);
  auto s = fd_connect(name, Deadline::after_seconds(5));
  if (!s.is_ok()) _exit(3);
  const int fds[] = {mem};
  if (!send_fds(s->get(), 42, fds, Deadline::after_seconds(5)).is_ok()) _exit(4);
  pollfd p{s->get(), POLLIN, 0};  // the socket is non-blocking: wait for the answer or the end
  (void)poll(&p, 1, 5000);
  _exit(0);
}

int exit_code(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string contents(int fd) {
  char buf[256] = {0};
  ssize_t n = pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, n) : "";
}

}  // namespace

TEST_CASE("a memfd passed to another process holds the same bytes there", "[fd_pass]") {
  const size_t before = open_fds();
  {
    const std::string name = unique_name("pass");
    auto l = fd_listen(name);
    REQUIRE(l.is_ok());
    const std::string text = "hello from the child";
    pid_t child = passing_child(name, text, 0);
    auto c = fd_accept(l->get(), child, Deadline::after_seconds(5));
    REQUIRE(c.is_ok());
    auto got = recv_fds(c->get(), Deadline::after_seconds(5));
    REQUIRE(got.is_ok());
    CHECK(got->tag == 42);
    REQUIRE(got->fds.size() == 1);
    CHECK(contents(got->fds[0].get()) == text);
    CHECK((fcntl(got->fds[0].get(), F_GETFD) & FD_CLOEXEC));
    // Both processes map the same pages.
    void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, got->fds[0].get(), 0);
    REQUIRE(p != MAP_FAILED);
    CHECK(std::memcmp(p, text.data(), text.size()) == 0);
    munmap(p, 4096);
    CHECK(send(c->get(), "k", 1, MSG_NOSIGNAL) == 1);
    CHECK(exit_code(child) == 0);
  }
  CHECK(open_fds() == before);
}

TEST_CASE("a stranger's connection is refused; the expected process still gets through",
          "[fd_pass]") {
  const std::string name = unique_name("stranger");
  auto l = fd_listen(name);
  REQUIRE(l.is_ok());
  pid_t stranger = passing_child(name, "from a stranger", 0);
  pid_t expected = passing_child(name, "from the expected rank", 300000);
  auto c = fd_accept(l->get(), expected, Deadline::after_seconds(5));
  REQUIRE(c.is_ok());
  auto got = recv_fds(c->get(), Deadline::after_seconds(5));
  REQUIRE(got.is_ok());
  REQUIRE(got->fds.size() == 1);
  CHECK(contents(got->fds[0].get()) == "from the expected rank");
  CHECK(send(c->get(), "k", 1, MSG_NOSIGNAL) == 1);
  CHECK(exit_code(expected) == 0);
  // Its connection was closed, before its send (the send fails: 4) or after (its read returns:
  // 0); either way it did not hang.
  const int stranger_code = exit_code(stranger);
  CHECK((stranger_code == 0 || stranger_code == 4));
}

TEST_CASE("fd passing waits end by their deadline", "[fd_pass]") {
  const std::string name = unique_name("deadline");
  auto l = fd_listen(name);
  REQUIRE(l.is_ok());
  auto a = fd_accept(l->get(), 1, Deadline::after_seconds(0.2));
  REQUIRE_FALSE(a.is_ok());
  CHECK(a.status().code() == Code::kTimeout);
  auto nobody = fd_connect(unique_name("nobody"), Deadline::after_seconds(0.2));
  REQUIRE_FALSE(nobody.is_ok());
  CHECK(nobody.status().code() == Code::kTimeout);
  auto s = fd_connect(name, Deadline::after_seconds(1));
  REQUIRE(s.is_ok());
  auto c = fd_accept(l->get(), getpid(), Deadline::after_seconds(1));
  REQUIRE(c.is_ok());
  auto silent = recv_fds(c->get(), Deadline::after_seconds(0.2));
  REQUIRE_FALSE(silent.is_ok());
  CHECK(silent.status().code() == Code::kTimeout);
}

TEST_CASE("bad fd messages are refused and every descriptor that came with them is closed",
          "[fd_pass]") {
  const size_t before = open_fds();
  auto send_raw = [](int sock, const FdHeader& h, int nfds) {
    std::vector<int> fds;
    for (int i = 0; i < nfds; ++i) fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
    const bool sent = send_with_fds(sock, &h, sizeof h, fds, Deadline::after_seconds(1)).is_ok();
    for (int fd : fds) close(fd);
    return sent;
  };
  struct Case {
    FdHeader h;
    int attach;
    const char* says;
  };
  const Case cases[] = {
      {{0x12345678, 2, 1}, 2, "not a chorus fd message"},
      {{kFdMagic, 1, 1}, 0, "says 1 descriptors but 0 came"},
      {{kFdMagic, 0, 1}, 3, "says 0 descriptors but 3 came"},
      {{kFdMagic, 17, 1}, 17, "more than 16"},
  };
  for (const Case& k : cases) {
    INFO(k.says);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(send_raw(sv[0], k.h, k.attach));
    auto r = recv_fds(sv[1], Deadline::after_seconds(2));
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find(k.says) != std::string::npos);
    close(sv[0]);
    close(sv[1]);
  }
  CHECK(open_fds() == before);
  // More than the limit is refused before anything is sent; bad names before any socket.
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  std::vector<int> many(17, sv[0]);
  CHECK(send_fds(sv[0], 1, many, Deadline::after_seconds(1)).code() == Code::kInvalidArgument);
  close(sv[0]);
  close(sv[1]);
  CHECK(fd_listen("").status().code() == Code::kInvalidArgument);
  CHECK(fd_listen("a/b").status().code() == Code::kInvalidArgument);
  const std::string name = unique_name("twice");
  auto first = fd_listen(name);
  REQUIRE(first.is_ok());
  CHECK(fd_listen(name).status().code() == Code::kInvalidUsage);
}
