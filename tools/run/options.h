// chorus-run's command line: what the user asked for, parsed and checked, before anything runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace chorus::run {

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  bool standalone = false;
  std::string master_addr;  // empty: 127.0.0.1 on one node; required for several
  int master_port = 0;      // 0: not given (one node picks a free port, several use 29500)
  std::string rdzv_id;      // --rdzv-id / --job-id; seeds the multi-node secret
  int max_restarts = 0;
  double grace_s = 5.0;  // SIGTERM -> SIGKILL delay when stopping workers
  bool prefix = true;
  bool elastic = false;           // --elastic: the store in chorus-run; a dead worker stops nobody
  bool mps = false;               // --mps: an MPS control daemon for the job (tools/run/mps.h)
  std::string bind = "none";      // --bind cores|numa|none
  std::string program;            // as the user wrote it (argv[0] of the workers)
  std::string program_path;       // resolved through PATH, checked executable
  std::vector<std::string> argv;  // the workers' argv: program then its arguments
  // Test hook CHORUS_TEST_RUN_REAP_DELAY_MS (0..10000): at the first worker found ended, chorus-run
  // waits this long before it looks at them all, so that others end meanwhile and one look finds
  // several (tests/launch/test_elastic.sh).
  int reap_delay_ms = 0;
};

// What parsing decided: options to run, or an exit code (help printed: 0; usage error: 2;
// program not found: 127; program not executable: 126) with the message already printed.
struct ParseOutcome {
  std::optional<RunOptions> options;
  int exit_code = 0;
};

ParseOutcome parse_options(int argc, char** argv);

// Resolves `program` as execvp would (PATH search unless it holds a '/'). On failure returns
// nullopt and sets `error` to a message naming the path(s) tried and `exit_code` to 127 or 126.
std::optional<std::string> resolve_program(const std::string& program, std::string& error,
                                           int& exit_code);

// "host:port", "host", "[v6addr]:port" -> host and port (port 0 when absent). False if malformed,
// and for an IPv6 address without brackets ("fe80::1": which ':' would start the port?).
bool split_endpoint(const std::string& endpoint, std::string& host, int& port);

}  // namespace chorus::run
