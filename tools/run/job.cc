// The job's shared facts (port, secret) and each worker's environment variables.
#include "tools/run/job.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

extern char** environ;

namespace chorus::run {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over the bytes, starting from `basis`, then mixed so that every input bit spreads.
uint64_t hash64(const std::string& text, uint64_t basis) {
  uint64_t h = basis;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return splitmix64(h ^ text.size());
}

}  // namespace

int pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string random_secret() {
  uint64_t words[2] = {0, 0};
  size_t got = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(words);
  while (got < sizeof(words)) {
    ssize_t n = getrandom(bytes + got, sizeof(words) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return fmt::format("{:016x}{:016x}", words[0], words[1]);
}

std::string derive_secret(const std::string& seed) {
  std::string text = "chorus-job-secret/v1/" + seed;
  return fmt::format("{:016x}{:016x}", hash64(text, 0xcbf29ce484222325ULL),
                     hash64(text, 0x84222325cbf29ce4ULL));
}

std::string choose_secret(const RunOptions& options, const std::string& master_addr,
                          int master_port) {
  const char* from_env = std::getenv("CHORUS_JOB_SECRET");
  if (from_env && *from_env) return from_env;
  if (options.nnodes == 1) return random_secret();
  if (!options.rdzv_id.empty()) return derive_secret("id:" + options.rdzv_id);
  return derive_secret(
      fmt::format("endpoint:{}:{}/nnodes:{}", master_addr, master_port, options.nnodes));
}

bool make_job(const RunOptions& options, Job& job, std::string& error) {
  job.master_addr = options.master_addr;
  job.master_port = options.master_port;
  if (job.master_port == 0) {
    job.master_port = pick_free_port();
    if (job.master_port == 0) {
      error = "could not pick a free port on 127.0.0.1 (bind to port 0 failed); give --master-port";
      return false;
    }
  }
  job.secret = choose_secret(options, job.master_addr, job.master_port);
  job.run_id = options.rdzv_id.empty() ? "none" : options.rdzv_id;
  return true;
}

std::vector<std::string> worker_environment(const RunOptions& options, const Job& job,
                                            int local_rank, int restart_count) {
  const int n = options.nproc_per_node;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(options.node_rank * n + local_rank)},
      {"WORLD_SIZE", std::to_string(options.nnodes * n)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(n)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", std::to_string(job.master_port)},
      {"CHORUS_JOB_SECRET", job.secret},
      {"CHORUS_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"TORCHELASTIC_RUN_ID", job.run_id},
  };
  if (n > 1 && !std::getenv("OMP_NUM_THREADS")) set.emplace("OMP_NUM_THREADS", "1");
  if (options.elastic) set.emplace("CHORUS_STORE_HOST", "launcher");
  if (!job.elastic_dir.empty()) set.emplace("CHORUS_ELASTIC_DIR", job.elastic_dir);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    if (!set.count(entry.substr(0, entry.find('=')))) env.push_back(std::move(entry));
  }
  for (auto& [key, value] : set) {
    env.push_back(key);
    env.back() += '=';
    env.back() += value;
  }
  return env;
}

}  // namespace chorus::run
