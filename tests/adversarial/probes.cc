// Process probes and raw socket moves for the adversarial tests (see probes.h).
#include "probes.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace chorus::test {
namespace {

int count_dir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - (std::string(path) == "/proc/self/fd" ? 1 : 0);  // the DIR's own descriptor
}

std::string hex_addr(const std::string& hex) {
  unsigned a = 0, port = 0;
  std::sscanf(hex.c_str(), "%8X:%4X", &a, &port);
  in_addr in{};
  in.s_addr = a;  // /proc/net/tcp prints the address in host byte order of a network-order value
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &in, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(port);
}

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int open_fds() {
  return count_dir("/proc/self/fd");
}
int live_threads() {
  return count_dir("/proc/self/task");
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

long rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f && std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f) std::fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

std::vector<std::string> listening_addresses() {
  std::set<unsigned long> inodes;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[256] = {0};
      std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof target - 1) > 0) {
        unsigned long ino = 0;
        if (std::sscanf(target, "socket:[%lu]", &ino) == 1) inodes.insert(ino);
      }
    }
    closedir(d);
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A" || !inodes.count(std::stoul(inode))) continue;
      out.push_back(std::string(table).find('6') == std::string::npos ? hex_addr(local)
                                                                      : "[ipv6]" + local);
    }
  }
  return out;
}

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool closed_by_peer(int fd, double seconds) {
  double end = now_s() + seconds;
  char buf[512];
  while (now_s() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) return true;
    }
  }
  return false;
}

std::string read_all(int fd, double seconds) {
  std::string got;
  double end = now_s() + seconds;
  char buf[4096];
  while (now_s() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

bool send_and_close(int port, const std::string& bytes) {
  int fd = raw_connect(port);
  if (fd < 0) return false;
  (void)!write(fd, bytes.data(), bytes.size());
  shutdown(fd, SHUT_WR);
  closed_by_peer(fd, 3.0);
  close(fd);
  return true;
}

bool sanitizer_report(const std::string& output) {
  for (const char* mark : {"WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
                           "ERROR: LeakSanitizer", "runtime error:"})
    if (output.find(mark) != std::string::npos) return true;
  return false;
}

bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace chorus::test
