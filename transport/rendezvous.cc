// Rendezvous from launcher environments and unique ids.
#include "transport/rendezvous.h"

#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "common/env.h"
#include "common/log.h"
#include "transport/rendezvous_file.h"

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

// The job's secret and where it came from; `fallback_text` is the last resort (public).
void job_secret(Rendezvous& r, const std::string& fallback_text) {
  r.secret_is_public = true;
  if (auto hex = env_get("CHORUS_JOB_SECRET")) {
    r.secret_is_public = false;
    if (parse_secret_hex(*hex, &r.secret)) {
      r.secret_origin = "CHORUS_JOB_SECRET";
    } else {
      r.secret = secret_from_string(*hex);
      r.secret_origin = "CHORUS_JOB_SECRET (not 32 hex digits: hashed as a passphrase)";
    }
    return;
  }
  for (const char* v : {"TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"})
    if (auto id = env_get(v)) {
      r.secret = secret_from_string(std::string(v) + "=" + *id);
      r.secret_origin = fmt::format("{}={}", v, *id);
      return;
    }
  if (auto job = env_get("SLURM_JOB_ID")) {
    std::string step = env_str("SLURM_STEP_ID", "0");
    r.secret = secret_from_string("slurm=" + *job + "." + step);
    r.secret_origin = fmt::format("SLURM_JOB_ID={}, SLURM_STEP_ID={}", *job, step);
    return;
  }
  r.secret = secret_from_string("addr=" + fallback_text);
  r.secret_origin = "the master address, port and world size (" + fallback_text + ")";
}

Status check_rank(Rendezvous& r, const char* rank_var, const char* size_var) {
  if (r.size < 1)
    return make_error(Code::kInvalidArgument, "{}={}: a job needs at least one rank", size_var,
                      r.size);
  if (r.rank >= r.size)
    return make_error(Code::kInvalidArgument, "{}={} is outside {}={} (ranks are 0..{})", rank_var,
                      r.rank, size_var, r.size, r.size - 1);
  return Status::ok();
}

// Rank, size and local rank from one launcher's variables, checked.
Status read_ranks(Rendezvous& r, const char* rank_var, const char* size_var, const char* local_var,
                  bool local_defaults_to_rank) {
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
  if (port < 1 || port > 65535)
    return make_error(Code::kInvalidArgument, "MASTER_PORT={} is not a port (1..65535)", port);
  return static_cast<int>(port);
}

// True when the launcher says every rank runs on this host.
bool single_node(int world) {
  for (const char* v : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    auto n = env_rank_var(v);
    if (n.is_ok()) return *n == world;
  }
  return env_str("SLURM_NNODES", env_str("SLURM_JOB_NUM_NODES", "")) == "1";
}

// CHORUS_STORE_HOST: "rank0" (the default) or "launcher" (chorus-run --elastic hosts it).
Result<bool> store_in_launcher() {
  const std::string v = env_str("CHORUS_STORE_HOST", "rank0");
  if (v != "rank0" && v != "launcher")
    return make_error(Code::kInvalidArgument, "CHORUS_STORE_HOST='{}': expected rank0 or launcher",
                      v);
  return v == "launcher";
}

// Rank 0 hosts the store on MASTER_PORT, at the address MASTER_ADDR names; everyone connects there.
// With CHORUS_STORE_HOST=launcher the launcher hosts it and rank 0 only connects.
Status with_master(Rendezvous& r, const std::string& addr, int port) {
  r.store = {addr, port};
  CHORUS_ASSIGN_OR_RETURN(bool launcher, store_in_launcher());
  if (launcher) r.store_host_rank = -1;  // no rank: found by pid, none matches
  if (r.rank != 0 || launcher) return Status::ok();
  std::string bind = store_bind_address(addr, single_node(r.size));
  auto server = StoreServer::start(bind, port, r.secret, r.size);
  if (!server.is_ok() && bind != "0.0.0.0" && bind != "::" && !env_get("CHORUS_STORE_BIND")) {
    // MASTER_ADDR names this host by an address it cannot bind (NAT, a floating address).
    log_warn(
        "bootstrap: cannot listen on {}:{} (MASTER_ADDR={}): {}; listening on every interface "
        "instead "
        "(CHORUS_STORE_BIND chooses)",
        bind, port, addr, server.status().message());
    bind = bind.find(':') != std::string::npos ? "::" : "0.0.0.0";
    server = StoreServer::start(bind, port, r.secret, r.size);
  }
  if (!server.is_ok())
    return server.status().wrap(fmt::format(
        "bootstrap: rank 0 cannot host the store on {} port {} (in use by another job?)", bind,
        port));
  r.server = std::move(server.value());
  return Status::ok();
}

// Rank 0's side of the file rendezvous: a loopback store (one host), published.
Status publish_store(Rendezvous& r) {
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> server,
                          StoreServer::start("127.0.0.1", 0, r.secret, r.size));
  r.store = server->address();
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  RendezvousRecord rec{
      r.store.host, r.store.port, static_cast<int>(getpid()), launcher_job_id(),
      static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec)};
  CHORUS_ASSIGN_OR_RETURN(auto remove, publish_rendezvous(r.secret, rec));
  server->on_stop(std::move(remove));
  r.server = std::move(server);
  return Status::ok();
}

// The others: read the file until its store proves it knows the secret; then keep the connection.
Status find_store(Rendezvous& r, Deadline deadline) {
  const std::string job = launcher_job_id();
  std::string last_reason, logged;
  while (true) {
    auto rec = read_rendezvous(r.secret, job);
    if (!rec.is_ok() && rec.status().code() != Code::kTimeout) return rec.status();
    if (rec.is_ok()) {
      SockAddr at{rec->host, rec->port};
      auto c = StoreClient::connect(at, r.secret, r.rank, r.size,
                                    Deadline::after_seconds(std::min(2.0, deadline.remaining())));
      if (c.is_ok()) {
        r.store = at;
        r.client = std::move(c.value());
        return Status::ok();
      }
      last_reason = fmt::format("the store named there ({}) failed: {}", at.to_string(),
                                c.status().message());
    } else {
      last_reason = rec.status().message();
    }
    if (last_reason != logged && last_reason.find("no file") == std::string::npos) {
      log_info("bootstrap: rank {}: {}; reading the rendezvous file again", r.rank, last_reason);
      logged = last_reason;
    }
    if (deadline.expired()) {
      auto path = rendezvous_path(r.secret);
      return make_error(
          Code::kTimeout,
          "bootstrap: rank {} found no usable {} after {:.0f} s ({}): is rank 0 running "
          "on this host? (across hosts, export MASTER_ADDR and MASTER_PORT: mpirun -x "
          "MASTER_ADDR=host "
          "-x MASTER_PORT=port)",
          r.rank, path.is_ok() ? *path : "rendezvous file", deadline.total(), last_reason);
    }
    usleep(20000);
  }
}

}  // namespace

std::string store_bind_address(const std::string& master_addr, bool single) {
  if (auto b = env_get("CHORUS_STORE_BIND")) return *b;
  auto numeric = resolve_host(master_addr);
  if (!numeric.is_ok()) return "0.0.0.0";  // the ranks' connects will say what is wrong
  const bool v6 = numeric->find(':') != std::string::npos;
  const std::string any = v6 ? "::" : "0.0.0.0";
  const bool literal = *numeric == master_addr;
  if (is_loopback_address(*numeric)) {
    // A name that resolves to loopback here (Debian maps the host name to 127.0.1.1) may name
    // a real address on other hosts: trust it only when it is literal, localhost, or one host.
    if (literal || master_addr == "localhost" || single) return *numeric;
    return any;
  }
  return is_local_address(*numeric) || literal ? *numeric : any;
}

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
    if (!addr)
      return make_error(Code::kInvalidArgument,
                        "RANK/WORLD_SIZE are set but MASTER_ADDR is not (launch with chorus-run or "
                        "torchrun, or export MASTER_ADDR and MASTER_PORT)");
    CHORUS_ASSIGN_OR_RETURN(int port, master_port());
    job_secret(r, fmt::format("{}:{}/{}", *addr, port, r.size));
    CHORUS_TRY(with_master(r, *addr, port));
    return r;
  }
  if (env_get("OMPI_COMM_WORLD_RANK")) {
    r.method = "mpirun";
    CHORUS_TRY(read_ranks(r, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", true));
    auto addr = env_get("MASTER_ADDR");
    job_secret(
        r, fmt::format("{}:{}/{}", addr.value_or("mpirun"), env_str("MASTER_PORT", "-"), r.size));
    if (addr) {
      CHORUS_ASSIGN_OR_RETURN(int port, master_port());
      CHORUS_TRY(with_master(r, *addr, port));
    } else {
      CHORUS_TRY(r.rank == 0 ? publish_store(r) : find_store(r, deadline));
    }
    return r;
  }
  if (env_get("SLURM_PROCID") && env_get("SLURM_NTASKS")) {
    r.method = "slurm";
    CHORUS_TRY(read_ranks(r, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", false));
    std::string addr = env_str(
        "MASTER_ADDR", slurm_first_host(env_str("SLURM_STEP_NODELIST",
                                                env_str("SLURM_JOB_NODELIST", "127.0.0.1"))));
    int port = 0;
    if (env_get("MASTER_PORT")) {
      CHORUS_ASSIGN_OR_RETURN(port, master_port());
    } else {
      port = 20000 + static_cast<int>(std::atoll(env_str("SLURM_JOB_ID", "0").c_str()) % 20000);
    }
    job_secret(r, fmt::format("{}:{}/{}", addr, port, r.size));
    CHORUS_TRY(with_master(r, addr, port));
    return r;
  }
  r.method = "single";
  CHORUS_TRY(random_bytes(r.secret.data(), r.secret.size()));
  r.secret_origin = "random (a world of one)";
  auto server = StoreServer::start("127.0.0.1", 0, r.secret, 1);
  CHORUS_TRY(server);
  r.store = server.value()->address();
  r.server = std::move(server.value());
  return r;
}

// ---- unique ids ----

namespace {
std::mutex g_id_mu;
// Stores made by make_unique_id; each stops by itself when its job ends and is reaped here.
std::vector<std::unique_ptr<StoreServer>>& id_servers() {
  static auto* v =
      new std::vector<std::unique_ptr<StoreServer>>();  // never destroyed: live until exit
  return *v;
}
void reap_id_servers_locked() {
  auto& v = id_servers();
  std::erase_if(v, [](const std::unique_ptr<StoreServer>& s) { return s->finished(); });
}
}  // namespace

int live_unique_id_stores() {
  std::lock_guard<std::mutex> lock(g_id_mu);
  reap_id_servers_locked();
  return static_cast<int>(id_servers().size());
}

Result<UniqueIdData> make_unique_id(bool in_process) {
  {
    std::lock_guard<std::mutex> lock(g_id_mu);
    reap_id_servers_locked();
  }
  Secret secret{};
  CHORUS_TRY(random_bytes(secret.data(), secret.size()));
  std::string host = "127.0.0.1";
  if (!in_process) {
    if (auto b = env_get("CHORUS_STORE_BIND")) {
      host = *b;
    } else {
      CHORUS_ASSIGN_OR_RETURN(host, local_address());
    }
  }
  StoreOptions opt;
  opt.stop_when_job_ends = true;
  auto started = StoreServer::start(host, 0, secret, opt);
  if (!started.is_ok() && !in_process && env_get("CHORUS_STORE_BIND"))
    return started.status().wrap(fmt::format("env CHORUS_STORE_BIND='{}'", host));
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<StoreServer> server, std::move(started));
  UniqueIdData id{};
  id.magic = kMagic;
  id.version = kProtocolVersion;
  id.port = static_cast<uint16_t>(server->address().port);
  id.secret = secret;
  std::string advertised = server->address().host;
  if (advertised == "0.0.0.0" || advertised == "::") {
    CHORUS_ASSIGN_OR_RETURN(advertised, local_address());
  }
  std::snprintf(id.host, sizeof id.host, "%s", advertised.c_str());
  std::lock_guard<std::mutex> lock(g_id_mu);
  id_servers().push_back(std::move(server));
  return id;
}

Result<Rendezvous> rendezvous_from_id(const UniqueIdData& id, int rank, int size) {
  if (id.magic != kMagic || id.version != kProtocolVersion)
    return make_error(
        Code::kInvalidArgument,
        "unique id is not from chorusGetUniqueId of this version (magic {:#x}, version {})",
        id.magic, id.version);
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(Code::kInvalidArgument, "rank {} is outside a world of {} ranks", rank, size);
  Rendezvous r;
  r.method = "unique id";
  r.rank = rank;
  r.size = size;
  r.local_rank = rank;
  r.secret = id.secret;
  r.secret_origin = "the unique id (random)";
  r.store_host_rank = -1;  // whoever called chorusGetUniqueId
  r.store = {std::string(id.host, strnlen(id.host, sizeof id.host)), id.port};
  return r;
}

}  // namespace chorus::transport

namespace chorus::transport {

Result<std::unique_ptr<StoreServer>> host_launcher_store(const std::string& master_addr, int port,
                                                         const std::string& secret_text,
                                                         int world) {
  Secret secret;  // as the workers read CHORUS_JOB_SECRET (job_secret above)
  if (!parse_secret_hex(secret_text, &secret)) secret = secret_from_string(secret_text);
  const std::string bind = store_bind_address(master_addr, true);
  auto server = StoreServer::start(bind, port, secret, world);
  if (!server.is_ok())
    return server.status().wrap(
        fmt::format("chorus-run cannot host the store on {} port {} (in use?)", bind, port));
  return server;
}

}  // namespace chorus::transport
