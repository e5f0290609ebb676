// The meeting directory of ddp/dist/rejoin.h.
#include "ddp/dist/rejoin.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace chorus {
namespace {

namespace fs = std::filesystem;

// Writes `bytes` to dir/name whole: a reader sees the old state or all of it.
void put_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string tmp = fmt::format("{}/.{}.{}", dir, name, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error(fmt::format("rejoin: cannot write {}", tmp));
  }
  if (std::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0)
    throw std::runtime_error(
        fmt::format("rejoin: cannot rename {} into place: {}", tmp, std::strerror(errno)));
}

std::vector<std::string> requests(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("join-", 0) == 0) out.push_back(name.substr(5));
  }
  std::sort(out.begin(), out.end());
  return out;
}

int env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 1000000)
    throw std::invalid_argument(fmt::format("env {}='{}' is not a count", name, v));
  return static_cast<int>(n);
}

}  // namespace

std::string elastic_dir() {
  const char* d = std::getenv("CHORUS_ELASTIC_DIR");
  return d ? d : "";
}

int elastic_rejoin_count() {
  return env_count("CHORUS_ELASTIC_REJOIN");
}

int count_join_requests(const std::string& dir) {
  return static_cast<int>(requests(dir).size());
}

Communicator grant_and_grow(Communicator& comm, const std::string& dir, int n) {
  const int size = comm.size(), nranks = size + n;
  if (comm.rank() != 0) return comm.grow(nranks);
  std::vector<std::string> who = requests(dir);
  if (static_cast<int>(who.size()) < n)
    throw std::runtime_error(
        fmt::format("rejoin: {} request(s) counted, {} left in {}", n, who.size(), dir));
  chorusUniqueId id = comm.grow_id();
  for (int i = 0; i < n; ++i) {
    std::string grant(id.internal, sizeof id.internal);
    grant += fmt::format(" {} {}", nranks, size + i);
    put_file(dir, "grant-" + who[static_cast<size_t>(i)], grant);
    fs::remove(dir + "/join-" + who[static_cast<size_t>(i)]);
  }
  return comm.grow(nranks, &id);
}

std::optional<Communicator> request_join(const std::string& dir, double timeout_s) {
  const std::string me = std::to_string(::getpid());
  put_file(dir, "join-" + me, "");
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::string grant_path = dir + "/grant-" + me;
  while (true) {
    std::ifstream in(grant_path, std::ios::binary);
    chorusUniqueId id;
    if (in && in.read(id.internal, sizeof id.internal)) {
      int nranks = 0, rank = -1;
      if (!(in >> nranks >> rank))
        throw std::runtime_error(fmt::format("rejoin: {} is corrupt", grant_path));
      fs::remove(grant_path);
      return Communicator::join_grow(nranks, id, rank);
    }
    if (fs::exists(dir + "/finished")) {
      fs::remove(dir + "/join-" + me);
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() > end)
      throw std::runtime_error(
          fmt::format("rejoin: no running rank let this worker join within {:g} s (no grant in {})",
                      timeout_s, dir));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void announce_finished(const std::string& dir) {
  put_file(dir, "finished", "");
}

}  // namespace chorus
