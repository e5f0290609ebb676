// Where a job's ranks meet: who am I, how many are we, where is the bootstrap store, what is
// the job's secret. Filled from the launcher's environment or from a caller's unique id.
//
// Environment, first match wins:
//   torchrun / chorus-run: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK,
//   LOCAL_WORLD_SIZE) OpenMPI mpirun:        OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE
//   (OMPI_COMM_WORLD_LOCAL_RANK);
//                          MASTER_ADDR/MASTER_PORT if exported, else rank 0 publishes the store's
//                          address in a file (rendezvous_file.h; one host only)
//   Slurm srun:            SLURM_PROCID, SLURM_NTASKS; MASTER_ADDR or the first host of
//                          SLURM_STEP_NODELIST/SLURM_JOB_NODELIST; MASTER_PORT or one derived from
//                          the job id
//   nothing set:           a world of one rank
// The store listens on the address MASTER_ADDR names (so on loopback only when it is a loopback
// address), or on CHORUS_STORE_BIND when set ("0.0.0.0": every interface).
// The secret: CHORUS_JOB_SECRET (32 hex digits, set by chorus-run), else derived from the
// launcher's job id (TORCHELASTIC_RUN_ID, PMIX_NAMESPACE / OMPI_MCA_orte_ess_jobid,
// SLURM_JOB_ID.SLURM_STEP_ID), else from MASTER_ADDR:MASTER_PORT and the world size. A derived
// secret is public text: it keeps stray jobs apart, not attackers out; CHORUS_DEBUG=INFO says
// which one a job uses.
#pragma once

#include <memory>
#include <string>

#include "transport/store.h"

namespace chorus::transport {

struct Rendezvous {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  SockAddr store;  // where to connect
  Secret secret{};
  std::string secret_origin;            // for the INFO line: where the secret came from
  bool secret_is_public = false;        // derived from text others can know
  std::string method;                   // "torchrun", "mpirun", "slurm", "single", "unique id"
  int store_host_rank = 0;              // the rank whose process hosts the store (-1: unknown)
  std::shared_ptr<StoreServer> server;  // set when this process hosts the store
  std::unique_ptr<StoreClient> client;  // set when the rendezvous already connected (mpirun file)
  bool joining = false;  // a newcomer to a running job (chorusCommGrow): no start barrier
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

// Starts a store and describes it in an id. The store stops once every rank of its job has
// joined and left (or at exit). in_process: every rank lives in this process (chorusCommInitAll),
// so the store listens on loopback only; otherwise on CHORUS_STORE_BIND or this host's address.
Result<UniqueIdData> make_unique_id(bool in_process = false);
Result<Rendezvous> rendezvous_from_id(const UniqueIdData& id, int rank, int size);
// Unique-id stores of this process still running (tests).
int live_unique_id_stores();

// "node[01-03],other" -> "node01": the first host of a Slurm node list.
std::string slurm_first_host(const std::string& nodelist);
// Where rank 0's store listens for MASTER_ADDR (see above); single_node: every rank is on this
// host.
std::string store_bind_address(const std::string& master_addr, bool single_node);

// chorus-run --elastic: the job's store in the launcher's process, so that no rank's death takes
// it away. The workers get CHORUS_STORE_HOST=launcher: rank 0 then hosts nothing and connects
// like everyone else. `secret_text` is the CHORUS_JOB_SECRET the workers get.
Result<std::unique_ptr<StoreServer>> host_launcher_store(const std::string& master_addr, int port,
                                                         const std::string& secret_text, int world);

}  // namespace chorus::transport
