// Where a job's ranks meet: who am I, how many are we, where is the bootstrap store, what is
// the job's secret. Filled from the launcher's environment or from a caller's unique id.
//
// Environment, first match wins:
//   torchrun / chorus-run: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK, LOCAL_WORLD_SIZE)
//   OpenMPI mpirun:        OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (OMPI_COMM_WORLD_LOCAL_RANK);
//                          MASTER_ADDR/MASTER_PORT if exported, else rank 0 publishes the store's
//                          address in a file under /tmp named after the mpirun job (one host only)
//   Slurm srun:            SLURM_PROCID, SLURM_NTASKS; MASTER_ADDR or the first host of
//                          SLURM_STEP_NODELIST/SLURM_JOB_NODELIST; MASTER_PORT or one derived from the job id
//   nothing set:           a world of one rank
// The secret: CHORUS_JOB_SECRET (32 hex digits, set by chorus-run), else derived from the
// launcher's job id (TORCHELASTIC_RUN_ID, PMIX_NAMESPACE / OMPI_MCA_orte_ess_jobid,
// SLURM_JOB_ID.SLURM_STEP_ID), else from MASTER_ADDR:MASTER_PORT and the world size.
#pragma once

#include <memory>
#include <string>

#include "transport/store.h"

namespace chorus::transport {

struct Rendezvous {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  SockAddr store;                       // where to connect
  Secret secret{};
  std::string method;                   // "torchrun", "mpirun", "slurm", "single", "unique id"
  std::unique_ptr<StoreServer> server;  // set when this process hosts the store
};

Result<Rendezvous> rendezvous_from_env(Deadline deadline);

// The 128-byte unique id: magic, secret, store address. Made by whoever hosts the store.
constexpr size_t kUniqueIdBytes = 128;
struct UniqueIdData {
  uint32_t magic;
  uint16_t version;
  uint16_t port;
  Secret secret;
  char host[96];
  uint8_t pad[kUniqueIdBytes - 4 - 2 - 2 - 16 - 96];
};
static_assert(sizeof(UniqueIdData) == kUniqueIdBytes);

// Starts a store (kept alive by this process until exit) and describes it in an id.
Result<UniqueIdData> make_unique_id();
Result<Rendezvous> rendezvous_from_id(const UniqueIdData& id, int rank, int size);

// "node[01-03],other" -> "node01": the first host of a Slurm node list.
std::string slurm_first_host(const std::string& nodelist);

}  // namespace chorus::transport
