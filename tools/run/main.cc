// chorus-run: starts the workers of a chorus job on this node, like torchrun --nproc-per-node.
// Usage: chorus-run [--standalone] -n N [--nnodes M --node-rank K --master-addr H --master-port P]
//        [--max-restarts R] [--elastic] [--mps] [--grace S] [--no-prefix] PROGRAM [ARGS...]
//        (--help)
#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tools/run/bind.h"
#include "tools/run/job.h"
#include "tools/run/mps.h"
#include "tools/run/options.h"
#include "tools/run/supervisor.h"
#include "transport/rendezvous.h"

namespace chorus::run {
namespace {

// Runs attempts until one succeeds, the restarts run out, or the launcher is told to stop.
int run_job(const RunOptions& options, const Job& job) {
  Supervisor supervisor(options, job);
  for (int restart = 0;; ++restart) {
    AttemptResult result = supervisor.run_attempt(restart);
    if (result.end == AttemptEnd::kSuccess) return 0;
    if (result.end != AttemptEnd::kWorkerFailed) return result.exit_code;
    if (int sig = received_stop_signal(); sig != 0) return 128 + sig;
    // --elastic restarts single workers into the running job (Supervisor), never all of them.
    if (options.elastic || restart >= options.max_restarts) {
      if (options.max_restarts > 0 && !options.elastic)
        say(fmt::format("giving up after {} restart{}: {}", restart, restart == 1 ? "" : "s",
                        result.cause));
      return result.exit_code;
    }
    say(fmt::format("restarting all workers (restart {} of {}) after {}", restart + 1,
                    options.max_restarts, result.cause));
  }
}

}  // namespace
}  // namespace chorus::run

int main(int argc, char** argv) {
  using namespace chorus::run;
  ParseOutcome parsed = parse_options(argc, argv);
  if (!parsed.options) return parsed.exit_code;
  const RunOptions& options = *parsed.options;
  Job job;
  std::string error;
  if (!make_job(options, job, error) ||
      !plan_bindings(options.bind, options.nproc_per_node, job.bindings, error) ||
      !install_signal_handlers(error)) {
    say(error);
    return 1;
  }
  for (size_t local = 0; local < job.bindings.size(); ++local)
    if (job.bindings[local].bound)
      say(fmt::format("rank {} bound to {}",
                      options.node_rank * options.nproc_per_node + int(local),
                      job.bindings[local].text));
  MpsDaemon mps;  // --mps: stopped when main returns
  if (options.mps && !mps.start(error)) {
    say(error);
    return 1;
  }
  std::unique_ptr<chorus::transport::StoreServer> store;  // --elastic: lives as long as the job
  if (options.elastic) {
    auto s = chorus::transport::host_launcher_store(job.master_addr, job.master_port, job.secret,
                                                    options.nnodes * options.nproc_per_node);
    if (!s.is_ok()) {
      say(s.status().message());
      return 1;
    }
    store = std::move(s.value());
  }
  if (options.elastic && options.max_restarts > 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = fmt::format("{}/chorus-elastic-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir.data())) {
      say(fmt::format("cannot make a directory for rejoining workers ({}): {}", dir,
                      std::strerror(errno)));
      return 1;
    }
    job.elastic_dir = dir;
  }
  const int code = run_job(options, job);
  if (!job.elastic_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(job.elastic_dir, ec);
  }
  return code;
}
