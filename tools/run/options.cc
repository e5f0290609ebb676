// chorus-run's command line (CLI11): flags, their torchrun spellings, checks and help text.
#include "tools/run/options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "common/env.h"

namespace chorus::run {
namespace {

constexpr int kUsageError = 2;
constexpr int kDefaultMultiNodePort = 29500;

const char* const kFooter = R"(
Each worker gets these environment variables:
  RANK                  global rank = node_rank * nproc_per_node + LOCAL_RANK
  WORLD_SIZE            nnodes * nproc_per_node
  LOCAL_RANK            rank on this node, 0 .. nproc_per_node-1
  LOCAL_WORLD_SIZE      nproc_per_node
  GROUP_RANK            node rank (--node-rank); GROUP_WORLD_SIZE = nnodes
  MASTER_ADDR           --master-addr, or 127.0.0.1 on one node
  MASTER_PORT           --master-port; on one node a free port is picked when not given
  CHORUS_JOB_SECRET     128-bit hex secret shared by the job's ranks: $CHORUS_JOB_SECRET if set;
                        else random (one node); else derived from --rdzv-id, or from
                        master addr:port and nnodes (predictable: guards against stray jobs,
                        not against attackers -- set CHORUS_JOB_SECRET for that)
  CHORUS_RESTART_COUNT  0, then 1, 2 ... after each restart (also TORCHELASTIC_RESTART_COUNT)
  TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, and OMP_NUM_THREADS=1 when unset and N > 1.

Output lines are prefixed "[RANK] " (stdout to stdout, stderr to stderr) unless --no-prefix.
When a worker fails, the others get SIGTERM, then SIGKILL after --grace seconds; the exit code
is the failed worker's (128+signal if it was killed). SIGINT/SIGTERM/SIGHUP are forwarded.

Examples:
  chorus-run --standalone -n 4 ./train_cnn --epochs 2
  chorus-run --nnodes 2 --node-rank 0 -n 2 --rdzv-endpoint node0:29500 ./train_cnn)";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "chorus-run: %s\nrun 'chorus-run --help' for usage\n", message.c_str());
  return kUsageError;
}

// "29500" -> 29500; anything outside 1..65535 or not a number -> 0.
int parse_port(const std::string& text) {
  if (text.empty() || text.size() > 5) return 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
  }
  int port = std::atoi(text.c_str());
  return port >= 1 && port <= 65535 ? port : 0;
}

bool is_executable_file(const std::string& path, int& err) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    err = errno;
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
    return false;
  }
  if (access(path.c_str(), X_OK) != 0) {
    err = errno;
    return false;
  }
  return true;
}

// CLI11 prints "Usage: chorus-run [OPTIONS]"; the program and its arguments belong there too.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: chorus-run [OPTIONS] [--] PROGRAM [ARGS...]\n";
  }
};

struct RawArgs {
  std::string master_port;
  std::string rdzv_endpoint;
  bool no_prefix = false;
};

void add_flags(CLI::App& app, RunOptions& o, RawArgs& raw) {
  app.add_option("-n,--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "number of worker processes on this node (default 1)")
      ->type_name("N");
  app.add_flag("--standalone", o.standalone,
               "single-node job: master on 127.0.0.1, free port picked (like torchrun)");
  app.add_option("--nnodes", o.nnodes, "number of nodes in the job (default 1)")->type_name("M");
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's rank, 0 .. nnodes-1")
      ->type_name("K");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "address of node 0, where rank 0 hosts the rendezvous store")
      ->type_name("HOST");
  app.add_option("--master-port,--master_port", raw.master_port,
                 "port of the rendezvous store (1..65535)")
      ->type_name("PORT");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", raw.rdzv_endpoint,
                 "HOST:PORT, same as --master-addr HOST --master-port PORT")
      ->type_name("HOST:PORT");
  app.add_option("--rdzv-id,--rdzv_id,--job-id,--job_id", o.rdzv_id,
                 "job id, same on every node; seeds CHORUS_JOB_SECRET on multi-node jobs")
      ->type_name("ID");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart all workers of this node up to K times after a failure (default 0)")
      ->type_name("K");
  app.add_option("--grace", o.grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
      ->type_name("SECONDS");
  app.add_option("--bind", o.bind,
                 "bind each worker to a core or a NUMA node (round-robin over those this "
                 "process may use), or none (default); its threads inherit the binding")
      ->type_name("cores|numa|none")
      ->check(CLI::IsMember({"cores", "numa", "none"}));
  app.add_flag("--elastic", o.elastic,
               "keep the other workers running when one dies: the rendezvous store lives in "
               "chorus-run (not in rank 0), so the survivors can shrink their communicator and "
               "go on, whichever rank died (one node); with --max-restarts R, a dead worker is "
               "restarted (R times in all) and rejoins the running job");
  app.add_flag("--mps", o.mps,
               "run CUDA's MPS control daemon for the job (nvidia-cuda-mps-control -d, pipe and "
               "log directories of its own; one already running is used), so that workers "
               "sharing a GPU run side by side instead of taking turns; stopped at the end");
  app.add_flag("--no-prefix,--no_prefix", raw.no_prefix,
               "do not prefix output lines with the rank");
}

// Checks the numbers and fills the endpoint; returns an exit code, or -1 when all is well.
int check_numbers(RunOptions& o, const RawArgs& raw) {
  if (o.nproc_per_node < 1)
    return usage_error(
        fmt::format("-n/--nproc-per-node must be at least 1, got {}", o.nproc_per_node));
  if (o.nnodes < 1)
    return usage_error(fmt::format("--nnodes must be at least 1, got {}", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return usage_error(fmt::format("--node-rank {} is outside 0..{} (--nnodes {})", o.node_rank,
                                   o.nnodes - 1, o.nnodes));
  if (o.standalone && o.nnodes > 1)
    return usage_error(fmt::format("--standalone runs one node, but --nnodes is {}", o.nnodes));
  if (o.max_restarts < 0)
    return usage_error(fmt::format("--max-restarts must be 0 or more, got {}", o.max_restarts));
  if (o.elastic && o.nnodes > 1)
    return usage_error(
        fmt::format("--elastic runs one node for now, but --nnodes is {}", o.nnodes));
  if (!(o.grace_s >= 0 && o.grace_s <= 3600))
    return usage_error(fmt::format("--grace must be 0..3600 seconds, got {}", o.grace_s));
  if (!raw.master_port.empty()) {
    o.master_port = parse_port(raw.master_port);
    if (o.master_port == 0)
      return usage_error(fmt::format(
          "bad port '{}' in --master-port: expected a number in 1..65535", raw.master_port));
  }
  if (!raw.rdzv_endpoint.empty()) {
    if (!o.master_addr.empty() || !raw.master_port.empty())
      return usage_error("give either --rdzv-endpoint or --master-addr/--master-port, not both");
    if (!split_endpoint(raw.rdzv_endpoint, o.master_addr, o.master_port))
      return usage_error(fmt::format(
          "bad --rdzv-endpoint '{}': expected HOST:PORT with port 1..65535 (an IPv6 address "
          "in brackets: [fe80::1]:29500)",
          raw.rdzv_endpoint));
  }
  if (o.nnodes > 1 && o.master_addr.empty())
    return usage_error(
        fmt::format("--nnodes {} needs --master-addr or --rdzv-endpoint naming node 0", o.nnodes));
  if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
  if (o.nnodes > 1 && o.master_port == 0) o.master_port = kDefaultMultiNodePort;
  Result<int64_t> delay = env_int_in("CHORUS_TEST_RUN_REAP_DELAY_MS", 0, 0, 10000);
  if (!delay.is_ok()) return usage_error(delay.status().message());
  o.reap_delay_ms = int(*delay);
  return -1;
}

// Takes the program and its arguments from what CLI11 left over; returns an exit code or -1.
int take_program(RunOptions& o, std::vector<std::string> rest) {
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty())
    return usage_error("missing the program to run (usage: chorus-run -n N prog args...)");
  if (rest.front().size() > 1 && rest.front()[0] == '-')
    return usage_error(
        fmt::format("unknown option '{}' (put '--' before a program whose name starts with '-')",
                    rest.front()));
  o.program = rest.front();
  o.argv = std::move(rest);
  std::string error;
  int code = 0;
  auto path = resolve_program(o.program, error, code);
  if (!path) {
    std::fprintf(stderr, "chorus-run: %s\n", error.c_str());
    return code;
  }
  o.program_path = *path;
  return -1;
}

}  // namespace

bool split_endpoint(const std::string& endpoint, std::string& host, int& port) {
  std::string port_text;
  if (!endpoint.empty() && endpoint[0] == '[') {
    auto close = endpoint.find(']');
    if (close == std::string::npos) return false;
    host = endpoint.substr(1, close - 1);
    if (close + 1 < endpoint.size()) {
      if (endpoint[close + 1] != ':') return false;
      port_text = endpoint.substr(close + 2);
    }
  } else {
    auto colon = endpoint.rfind(':');
    host = endpoint.substr(0, colon);
    if (colon != std::string::npos) port_text = endpoint.substr(colon + 1);
    // "fe80::1" is an IPv6 address, not host "fe80:" port 1: such hosts need brackets.
    if (host.find(':') != std::string::npos) return false;
  }
  if (host.empty()) return false;
  port = 0;
  if (port_text.empty()) return endpoint.back() != ':';
  port = parse_port(port_text);
  return port != 0;
}

std::optional<std::string> resolve_program(const std::string& program, std::string& error,
                                           int& exit_code) {
  int err = 0;
  if (program.find('/') != std::string::npos) {
    if (is_executable_file(program, err)) return program;
    exit_code = err == ENOENT || err == ENOTDIR ? 127 : 126;
    error = fmt::format("cannot run program '{}': {}", program,
                        err == EACCES ? "not executable (permission denied)" : std::strerror(err));
    return std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::string dirs = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  bool found_unexecutable = false;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate, err)) return candidate;
    if (err == EACCES) found_unexecutable = true;
    start = end + 1;
  }
  exit_code = found_unexecutable ? 126 : 127;
  error = found_unexecutable
              ? fmt::format("cannot run program '{}': found in PATH but not executable", program)
              : fmt::format("program '{}' not found in PATH ({})", program, dirs);
  return std::nullopt;
}

ParseOutcome parse_options(int argc, char** argv) {
  RunOptions o;
  RawArgs raw;
  CLI::App app{"chorus-run: start N local worker processes of a chorus job (like torchrun)",
               "chorus-run"};
  app.formatter(std::make_shared<UsageFormatter>());
  add_flags(app, o, raw);
  app.footer(kFooter);
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return {std::nullopt, app.exit(e)};
    return {std::nullopt, usage_error(e.what())};
  }
  o.prefix = !raw.no_prefix;
  if (int code = check_numbers(o, raw); code >= 0) return {std::nullopt, code};
  if (int code = take_program(o, app.remaining()); code >= 0) return {std::nullopt, code};
  return {std::move(o), 0};
}

}  // namespace chorus::run
