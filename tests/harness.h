// Multi-rank test harness: forks real processes, one per rank, with launcher variables set.
// Each rank's stderr is captured so tests can check the error messages users would read.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace chorus::test {

struct RankResult {
  int exit_code = -1;  // -signal when killed
  std::string output;  // what the rank wrote to stdout and stderr
  double seconds = 0;  // from start until this rank ended
};

struct RunOptions {
  std::map<std::string, std::string> env;  // extra variables for every rank
  double limit_seconds = 60;               // ranks still alive then are killed (a hang = failure)
  int world_size = -1;  // WORLD_SIZE to announce (-1: the number of ranks started)
  int port = 0;         // 0: pick a free one
  // No rank is reaped until every rank has ended: the dead stay zombies meanwhile, as under a
  // launcher slow to reap (kill(pid, 0) still finds them).
  bool reap_last = false;
};

// Runs fn(rank) in n forked processes; fn's return value is the exit code (exceptions -> 1).
std::vector<RankResult> run_ranks(int n, const std::function<int(int rank)>& fn,
                                  const RunOptions& opt = {});
int free_port();

// Runs `cmd` through /bin/sh with stderr joined to stdout; status as pclose() returns it.
struct ShellResult {
  int status = -1;
  std::string output;
};
ShellResult run_shell(const std::string& cmd);
bool contains(const std::string& text, const std::string& part);

// A barrier of the forked ranks that no communicator carries: made before run_ranks, in shared
// memory the ranks inherit. For a test whose next call fails the communicator on purpose: a
// failure fails every operation still in flight, so a rank that went on to it could fail a
// slower rank's earlier call (its last step still under way), and a rank that exits could leave
// a slower one to hear of that first.
class RankBarrier {
 public:
  explicit RankBarrier(int n);
  ~RankBarrier();
  RankBarrier(const RankBarrier&) = delete;
  RankBarrier& operator=(const RankBarrier&) = delete;
  // Until all n ranks have arrived as often as this one (false after `seconds`).
  bool arrive_and_wait(double seconds = 30);

 private:
  int n_;
  int mine_ = 0;  // this process's arrivals
  void* shared_;  // the arrivals of all, an atomic int
};

}  // namespace chorus::test
