// The mpirun rendezvous without MASTER_ADDR: rank 0 publishes its store's address in a file on
// this host; the other ranks read it. One host only.
//
//   directory  ${TMPDIR:-/tmp}/chorus-<uid>: mode 0700, owned by this user; checked, never
//              followed if it is a symbolic link
//   name       rdzv-<16 hex digits of mac(secret, "rendezvous file")>: derived from the
//              secret, but revealing nothing of it
//   contents   "chorus-rdzv 1", then host, port, the writer's pid, the launcher's job id
//              (PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid, "-" if none) and its start time
//
// The writer creates a fresh temporary file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) and renames
// it over the name; the file is removed when the store stops. A reader skips a file that is not
// a regular file of this user with mode 0600, one from another job id, and one whose writer is
// gone -- and keeps reading: the address is trusted only once the store there has proved that
// it knows the job secret (wire.h), so a stale or planted file costs a retry, never the secret.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "transport/auth.h"

namespace chorus::transport {

struct RendezvousRecord {
  std::string host;
  int port = 0;
  int pid = 0;
  std::string job = "-";
  uint64_t start_ns = 0;
};

// Pure: the text of a rendezvous file, checked field by field (also the fuzzer's entry point).
Result<RendezvousRecord> parse_rendezvous_record(const std::string& text);
std::string format_rendezvous_record(const RendezvousRecord& r);

// The per-user directory (created when missing, checked either way) and the file's full path.
Result<std::string> rendezvous_dir();
Result<std::string> rendezvous_path(const Secret& secret);
// The launcher's job id of this process, "-" when none is set.
std::string launcher_job_id();

// Publishes the record; the returned function removes the file (if it is still the one written).
Result<std::function<void()>> publish_rendezvous(const Secret& secret, const RendezvousRecord& r);
// Reads the file. kTimeout-coded errors mean "nothing usable yet" and say why (no file, another
// job's, a dead writer, wrong owner or mode); other codes are hard errors (the directory).
Result<RendezvousRecord> read_rendezvous(const Secret& secret, const std::string& my_job);

}  // namespace chorus::transport
