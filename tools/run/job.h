// What every worker of one chorus-run job shares (endpoint, secret) and the environment of each.
#pragma once

#include <string>
#include <vector>

#include "tools/run/bind.h"
#include "tools/run/options.h"

namespace chorus::run {

struct Job {
  std::string master_addr;
  int master_port = 0;
  std::string secret;             // 32 lower-case hex digits
  std::string run_id;             // TORCHELASTIC_RUN_ID
  std::vector<Binding> bindings;  // one per local rank (--bind)
  // --elastic --max-restarts: where restarted workers and the running ones meet
  // (CHORUS_ELASTIC_DIR; ddp/dist/rejoin.h); chorus-run makes and removes it.
  std::string elastic_dir;
};

// Fixes the endpoint (picking a free port on one node when none was given) and the secret.
// Returns false with `error` set when no port could be picked.
bool make_job(const RunOptions& options, Job& job, std::string& error);

// A free TCP port on 127.0.0.1: bind port 0, read it back, close. Another process may take it
// before rank 0 binds it (the same race torchrun --standalone has); returns 0 on failure.
int pick_free_port();

// 128 random bits from getrandom(), as hex.
std::string random_secret();
// 128 bits derived from `seed` (deterministic, not cryptographic: whoever knows the seed knows
// the secret). Used so that every node of a multi-node job computes the same value.
std::string derive_secret(const std::string& seed);

// The secret this job uses: $CHORUS_JOB_SECRET if set and not empty; else random on one node;
// else derived from --rdzv-id, or from "addr:port/nnodes" when no id was given.
std::string choose_secret(const RunOptions& options, const std::string& master_addr,
                          int master_port);

// The worker's full environment ("KEY=value"): the launcher's own plus the variables chorus-run
// sets (see --help). `local_rank` is 0 .. nproc_per_node-1.
std::vector<std::string> worker_environment(const RunOptions& options, const Job& job,
                                            int local_rank, int restart_count);

}  // namespace chorus::run
