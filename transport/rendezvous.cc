// Rendezvous from launcher environments and unique ids.
#include "transport/rendezvous.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <vector>

#include "common/env.h"
#include "common/log.h"

namespace chorus::transport {
namespace {

Result<int> env_rank_var(const char* name) {
  auto v = env_get(name);
  if (!v) return make_error(Code::kInvalidArgument, "{} is not set", name);
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || x < 0 || x > (1 << 24))
    return make_error(Code::kInvalidArgument, "{}='{}' is not a rank/size number", name, *v);
  return static_cast<int>(x);
}

Secret job_secret(const std::string& fallback_text) {
  Secret s{};
  if (auto hex = env_get("CHORUS_JOB_SECRET")) {
    if (parse_secret_hex(*hex, &s)) return s;
    return secret_from_string(*hex);
  }
  for (const char* v : {"TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"})
    if (auto id = env_get(v)) return secret_from_string(std::string(v) + "=" + *id);
  if (auto job = env_get("SLURM_JOB_ID")) return secret_from_string("slurm=" + *job + "." + env_str("SLURM_STEP_ID", "0"));
  return secret_from_string("addr=" + fallback_text);
}

Status check_rank(Rendezvous& r, const char* rank_var, const char* size_var) {
  if (r.size < 1) return make_error(Code::kInvalidArgument, "{}={}: a job needs at least one rank", size_var, r.size);
  if (r.rank >= r.size)
    return make_error(Code::kInvalidArgument, "{}={} is outside {}={} (ranks are 0..{})", rank_var, r.rank, size_var, r.size, r.size - 1);
  return Status::ok();
}

// Rank, size and local rank from one launcher's variables, checked.
Status read_ranks(Rendezvous& r, const char* rank_var, const char* size_var, const char* local_var, bool local_defaults_to_rank) {
  CHORUS_ASSIGN_OR_RETURN(r.rank, env_rank_var(rank_var));
  CHORUS_ASSIGN_OR_RETURN(r.size, env_rank_var(size_var));
  CHORUS_TRY(check_rank(r, rank_var, size_var));
  auto lr = env_rank_var(local_var);
  r.local_rank = lr.is_ok() ? *lr : (local_defaults_to_rank ? r.rank : 0);
  return Status::ok();
}

Result<int> master_port() {
  CHORUS_ASSIGN_OR_RETURN(int64_t port, env_int("MASTER_PORT", -1));
  if (port == -1) return make_error(Code::kInvalidArgument, "MASTER_PORT is not set");
  if (port < 1 || port > 65535) return make_error(Code::kInvalidArgument, "MASTER_PORT={} is not a port (1..65535)", port);
  return static_cast<int>(port);
}

// Rank 0 hosts the store on MASTER_PORT (all interfaces), everyone connects to MASTER_ADDR.
Status with_master(Rendezvous& r, const std::string& addr, int port) {
  r.store = {addr, port};
  if (r.rank == 0) {
    auto server = StoreServer::start("0.0.0.0", port, r.secret, r.size);
    if (!server.is_ok())
      return server.status().wrap(fmt::format("bootstrap: rank 0 cannot host the store on port {} (in use by another job?)", port));
    r.server = std::move(server.value());
  }
  return Status::ok();
}

// mpirun without MASTER_ADDR: rank 0 publishes its store's address in a file on this host.
Status with_file(Rendezvous& r, Deadline deadline) {
  std::string path = "/tmp/chorus-rdzv-" + secret_hex(r.secret).substr(0, 16);
  if (r.rank == 0) {
    CHORUS_ASSIGN_OR_RETURN(std::string host, local_address());
    auto server = StoreServer::start(host, 0, r.secret, r.size);
    CHORUS_TRY(server);
    r.store = server.value()->address();
    r.server = std::move(server.value());
    std::string tmp = path + ".tmp" + std::to_string(getpid());
    {
      std::ofstream f(tmp);
      f << r.store.host << "\n" << r.store.port << "\n";
      if (!f) return make_error(Code::kSystemError, "bootstrap: cannot write {}", tmp);
    }
    if (rename(tmp.c_str(), path.c_str()) != 0)
      return make_error(Code::kSystemError, "bootstrap: cannot publish {}: {}", path, strerror(errno));
    return Status::ok();
  }
  while (true) {
    std::ifstream f(path);
    std::string host, port;
    if (f && std::getline(f, host) && std::getline(f, port)) {
      r.store = {host, std::atoi(port.c_str())};
      return Status::ok();
    }
    if (deadline.expired())
      return make_error(Code::kTimeout, "bootstrap: rank {} found no {} after {:.0f} s: is rank 0 running on this host? "
                        "(across hosts, export MASTER_ADDR and MASTER_PORT: mpirun -x MASTER_ADDR=host -x MASTER_PORT=port)",
                        r.rank, path, deadline.total());
    usleep(20000);
  }
}

}  // namespace

std::string slurm_first_host(const std::string& nodelist) {
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') depth++;
    if (c == ']') depth--;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  auto lb = first.find('[');
  if (lb == std::string::npos) return first;
  std::string prefix = first.substr(0, lb), range = first.substr(lb + 1);
  std::string lo;
  for (char c : range) {
    if (c == '-' || c == ',' || c == ']') break;
    lo += c;
  }
  return prefix + lo;
}

Result<Rendezvous> rendezvous_from_env(Deadline deadline) {
  Rendezvous r;
  if (env_get("RANK") || env_get("WORLD_SIZE")) {
    r.method = "torchrun";
    CHORUS_TRY(read_ranks(r, "RANK", "WORLD_SIZE", "LOCAL_RANK", true));
    auto addr = env_get("MASTER_ADDR");
    if (!addr) return make_error(Code::kInvalidArgument, "RANK/WORLD_SIZE are set but MASTER_ADDR is not (launch with chorus-run or torchrun, or export MASTER_ADDR and MASTER_PORT)");
    CHORUS_ASSIGN_OR_RETURN(int port, master_port());
    r.secret = job_secret(fmt::format("{}:{}/{}", *addr, port, r.size));
    CHORUS_TRY(with_master(r, *addr, port));
    return r;
  }
  if (env_get("OMPI_COMM_WORLD_RANK")) {
    r.method = "mpirun";
    CHORUS_TRY(read_ranks(r, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", true));
    auto addr = env_get("MASTER_ADDR");
    r.secret = job_secret(fmt::format("{}:{}/{}", addr.value_or("mpirun"), env_str("MASTER_PORT", "-"), r.size));
    if (addr) {
      CHORUS_ASSIGN_OR_RETURN(int port, master_port());
      CHORUS_TRY(with_master(r, *addr, port));
    } else {
      CHORUS_TRY(with_file(r, deadline));
    }
    return r;
  }
  if (env_get("SLURM_PROCID") && env_get("SLURM_NTASKS")) {
    r.method = "slurm";
    CHORUS_TRY(read_ranks(r, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", false));
    std::string addr = env_str("MASTER_ADDR", slurm_first_host(env_str("SLURM_STEP_NODELIST", env_str("SLURM_JOB_NODELIST", "127.0.0.1"))));
    int port = 0;
    if (env_get("MASTER_PORT")) {
      CHORUS_ASSIGN_OR_RETURN(port, master_port());
    } else {
      port = 20000 + static_cast<int>(std::atoll(env_str("SLURM_JOB_ID", "0").c_str()) % 20000);
    }
    r.secret = job_secret(fmt::format("{}:{}/{}", addr, port, r.size));
    CHORUS_TRY(with_master(r, addr, port));
    return r;
  }
  r.method = "single";
  r.secret = job_secret(fmt::format("single/{}", getpid()));
  auto server = StoreServer::start("127.0.0.1", 0, r.secret, 1);
  CHORUS_TRY(server);
  r.store = server.value()->address();
  r.server = std::move(server.value());
  return r;
}

namespace {
std::mutex g_id_mu;
std::vector<std::unique_ptr<StoreServer>>& id_servers() {
  static auto* v = new std::vector<std::unique_ptr<StoreServer>>();  // live until exit
  return *v;
}
}  // namespace

Result<UniqueIdData> make_unique_id() {
  Secret secret{};
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(reinterpret_cast<char*>(secret.data()), secret.size());
  if (!urandom) return make_error(Code::kSystemError, "cannot read /dev/urandom for the job secret");
  CHORUS_ASSIGN_OR_RETURN(std::string host, local_address());
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> server, StoreServer::start(host, 0, secret, 0));
  UniqueIdData id{};
  id.magic = kMagic;
  id.version = kProtocolVersion;
  id.port = static_cast<uint16_t>(server->address().port);
  id.secret = secret;
  std::snprintf(id.host, sizeof id.host, "%s", server->address().host.c_str());
  std::lock_guard<std::mutex> lock(g_id_mu);
  id_servers().push_back(std::move(server));
  return id;
}

Result<Rendezvous> rendezvous_from_id(const UniqueIdData& id, int rank, int size) {
  if (id.magic != kMagic || id.version != kProtocolVersion)
    return make_error(Code::kInvalidArgument, "unique id is not from chorusGetUniqueId of this version (magic {:#x}, version {})", id.magic, id.version);
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(Code::kInvalidArgument, "rank {} is outside a world of {} ranks", rank, size);
  Rendezvous r;
  r.method = "unique id";
  r.rank = rank;
  r.size = size;
  r.local_rank = rank;
  r.secret = id.secret;
  r.store = {std::string(id.host, strnlen(id.host, sizeof id.host)), id.port};
  return r;
}

}  // namespace chorus::transport
