// The grow id (chorusCommGetUniqueId of a communicator, for chorusCommGrow): what a new process
// needs to join a running job -- where its bootstrap store is, the job secret, and which grow it
// is part of. Laid out in a chorusUniqueId's 128 bytes; protocol in grow.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/auth.h"

namespace chorus {

struct GrowId {
  uint32_t magic;
  uint16_t version;
  uint16_t port;             // the bootstrap store's
  transport::Secret secret;  // the job's
  uint64_t token;            // random: names this grow's record in the store
  int32_t base;              // job rank of the first newcomer (rank old_size of the new comm)
  int32_t old_size;          // the growing communicator's size
  char host[64];             // the bootstrap store's numeric address, NUL-terminated
  uint8_t pad[128 - 4 - 2 - 2 - 16 - 8 - 4 - 4 - 64];
};
static_assert(sizeof(GrowId) == 128);

// An id as a caller hands it in (outside bytes): of this version and well formed, or why not.
Status check_grow_id(const GrowId& id);

// What the coordinator writes in the store for the newcomers: the new communicator's name, uid,
// size and mode, and the members' job ranks. Text: "prefix uid nranks deterministic jr0 jr1 ...".
struct GrowRecord {
  std::string prefix;
  uint64_t uid = 0;
  int nranks = 0;
  int deterministic = 0;
  std::vector<int> job_ranks;  // the members', by rank (id.old_size of them)
};
std::string encode_grow_record(const GrowRecord& r);
// Checks it against the id it belongs to (store bytes: fuzzed, fuzz/grow_record.cc).
Result<GrowRecord> decode_grow_record(const std::string& text, const GrowId& id);

}  // namespace chorus
