// chorusCommGrow: a larger communicator of a running communicator's ranks and new processes that
// join the job (as NCCL's ncclCommGrow): a restarted worker rejoining, or more workers.
//
// Protocol, through the job's bootstrap store (under chorus-run --elastic it lives in the
// launcher, so no worker's death takes it away; elsewhere the survivors of its host's death
// move to a new one, failover.cc, and a grow started after that runs there):
//   1. one member, the coordinator, calls chorusCommGetUniqueId: it reserves a block of
//      CHORUS_MAX_RANKS job ranks for newcomers (store key chorus/grow/next) and returns an id
//      with the store's address, the job secret, a random token, the block's first job rank
//      and the communicator's size. The caller hands the id to the newcomers (a file, the
//      launcher, its own means).
//   2. every member calls chorusCommGrow(comm, n, id on the coordinator / NULL elsewhere, -1):
//      the coordinator writes the grow's record under chorus/grow/<token> (the new
//      communicator's name, size and mode, and the members' job ranks), then points this
//      communicator's grow number at it; the other members read it there, so they need no id.
//      Members keep their ranks; newcomers are ranks old size .. n-1.
//   3. each newcomer calls chorusCommGrow(NULL, n, id, rank): it joins the job's store as job
//      rank base + (rank - old size), without the start barrier (the job is running), reads
//      the record, and everyone creates the new communicator as a split does: new links,
//      through the store, so nothing of the old links matters.
//   4. the coordinator marks the token used once its new communicator exists: a later grow
//      with the same id fails at once, saying so.
// Every wait is bounded by the timeout; a member that fails or dies meanwhile ends the others'
// waits naming it. Assumes one grow at a time per job (step 1 reads, then writes, the block).
#include "collectives/grow.h"

#include <cstring>
#include <sstream>

#include "chorus/chorus.h"
#include "collectives/comm.h"
#include "collectives/job.h"
#include "common/env.h"
#include "common/log.h"
#include "transport/rendezvous.h"
#include "transport/wire.h"

namespace chorus {
namespace {

constexpr uint32_t kGrowMagic = 0x43475257;  // "WRGC": not a chorusGetUniqueId id
constexpr uint16_t kGrowVersion = 1;
constexpr const char* kNextKey = "chorus/grow/next";

std::string record_key(uint64_t token) {
  return fmt::format("chorus/grow/{:016x}", token);
}

Status check_size(int nranks, int old_size) {
  if (nranks <= old_size || nranks > CHORUS_MAX_RANKS)
    return make_error(Code::kInvalidArgument,
                      "nRanks {} must be more than the communicator's {} ranks and at most "
                      "CHORUS_MAX_RANKS ({})",
                      nranks, old_size, CHORUS_MAX_RANKS);
  return Status::ok();
}

std::vector<int> grown_job_ranks(std::vector<int> members, int base, int nranks) {
  for (int r = static_cast<int>(members.size()), j = base; r < nranks; ++r, ++j)
    members.push_back(j);
  return members;
}

}  // namespace

std::string encode_grow_record(const GrowRecord& r) {
  std::string out = fmt::format("{} {} {} {}", r.prefix, r.uid, r.nranks, r.deterministic);
  for (int j : r.job_ranks) out += fmt::format(" {}", j);
  return out;
}

Result<GrowRecord> decode_grow_record(const std::string& v, const GrowId& id) {
  GrowRecord r;
  std::istringstream in(v);
  in >> r.prefix >> r.uid >> r.nranks >> r.deterministic;
  for (int j; in >> j;) r.job_ranks.push_back(j);
  bool ranks_ok = true;
  for (int j : r.job_ranks) ranks_ok = ranks_ok && j >= 0 && j < id.base;
  if (!in.eof() || r.prefix.empty() || r.nranks <= id.old_size || r.nranks > CHORUS_MAX_RANKS ||
      (r.deterministic != 0 && r.deterministic != 1) || !ranks_ok ||
      static_cast<int>(r.job_ranks.size()) != id.old_size)
    return make_error(Code::kRemoteError, "the store's record of this grow is corrupt: '{}'",
                      v.substr(0, 200));
  return r;
}

Status check_grow_id(const GrowId& id) {
  if (id.magic != kGrowMagic || id.version != kGrowVersion)
    return make_error(Code::kInvalidArgument,
                      "the grow id is not from chorusCommGetUniqueId of this version (magic {:#x}, "
                      "version {}; a chorusGetUniqueId id cannot grow a communicator)",
                      id.magic, id.version);
  const size_t host_len = strnlen(id.host, sizeof id.host);
  if (id.old_size < 1 || id.old_size > CHORUS_MAX_RANKS || id.base < id.old_size ||
      id.base > INT32_MAX - CHORUS_MAX_RANKS || host_len == 0 || host_len == sizeof id.host)
    return make_error(Code::kInvalidArgument, "the grow id is corrupt (size {}, first rank {})",
                      id.old_size, id.base);
  return Status::ok();
}

Status CommImpl::grow_id(GrowId* out) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, job_unless_stopping(""));
  // After a failover the id names the new store (failover.cc).
  if (Status up = job->await_store(Deadline::after_seconds(timeout_s_)); !up.is_ok())
    return make_error(up.code(), "{}: newcomers have nowhere to meet", up.message());
  auto& store = job->store();
  GrowId id;
  std::memset(&id, 0, sizeof id);
  int64_t base = job->size();
  if (auto next = store.try_get(kNextKey); next.is_ok()) base = std::stoll(*next);
  if (base < 0 || base > INT32_MAX - 2 * int64_t{CHORUS_MAX_RANKS})
    return make_error(Code::kInternalError, "the job has no job ranks left for newcomers ({})",
                      base);
  CHORUS_TRY(store.set(kNextKey, std::to_string(base + CHORUS_MAX_RANKS)));
  const auto& server = store.server();
  if (server.host.size() >= sizeof id.host)
    return make_error(Code::kInternalError, "the store's address '{}' does not fit a grow id",
                      server.host);
  id.magic = kGrowMagic;
  id.version = kGrowVersion;
  id.port = static_cast<uint16_t>(server.port);
  id.secret = job->secret();
  CHORUS_TRY(transport::random_bytes(&id.token, sizeof id.token));
  id.base = static_cast<int32_t>(base);
  id.old_size = size();
  std::snprintf(id.host, sizeof id.host, "%s", server.host.c_str());
  *out = id;
  return Status::ok();
}

Result<std::shared_ptr<CommImpl>> CommImpl::grow(int nranks, const GrowId* id, double timeout_s,
                                                 int deterministic) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, job_unless_stopping(""));
  CHORUS_TRY(check_size(nranks, size()));
  if (id) {
    CHORUS_TRY(check_grow_id(*id));
    if (id->secret != job->secret())
      return make_error(Code::kInvalidArgument, "the grow id is from another job");
    if (id->old_size != size())
      return make_error(Code::kInvalidArgument,
                        "the grow id was made for a communicator of {} ranks; this one has {}",
                        id->old_size, size());
  }
  const double t = timeout_s > 0 ? timeout_s : timeout_s_;
  const std::string origin = timeout_s > 0 ? "the communicator's config" : timeout_origin_;
  const auto deadline = Deadline::after_seconds(t);
  if (Status up = job->await_store(deadline); !up.is_ok())
    return make_error(up.code(), "{}: newcomers have nowhere to meet", up.message());
  auto& store = job->store();
  const uint64_t n = ++split_count_;
  const std::string pointer = fmt::format("{}/grow{}", prefix_, n);
  GrowRecord rec;
  rec.prefix = child_prefix(fmt::format(".g{}", n));
  rec.uid = transport::hash64(rec.prefix.data(), rec.prefix.size(), uid_);
  rec.nranks = nranks;
  rec.deterministic = deterministic >= 0 ? deterministic : (tuner_.deterministic ? 1 : 0);
  rec.job_ranks = job_ranks_;
  int base = 0;
  if (id) {
    if (store.try_get(record_key(id->token)).is_ok())
      return make_error(Code::kInvalidUsage,
                        "this grow id was used already (each grow takes a new one from "
                        "chorusCommGetUniqueId)");
    base = id->base;
    CHORUS_TRY(store.set(record_key(id->token), encode_grow_record(rec)));
    CHORUS_TRY(store.set(pointer, fmt::format("{} {} {} {}", id->token, base, nranks, rank_)));
  } else {
    auto v = store.get(pointer, deadline, [this] {
      return failed_.load() ? error().wrap("waiting for the grow's coordinator") : Status::ok();
    });
    if (!v.is_ok() && v.status().code() == Code::kTimeout)
      return make_error(Code::kTimeout,
                        "no member called chorusCommGrow with the grow id within {:g} s ({}): one "
                        "member passes the id from chorusCommGetUniqueId, the others NULL",
                        t, origin);
    if (!v.is_ok()) return v.status();
    unsigned long long token = 0;
    int theirs = 0, coordinator = -1;
    if (std::sscanf(v->c_str(), "%llu %d %d %d", &token, &base, &theirs, &coordinator) != 4)
      return make_error(Code::kRemoteError, "the grow's pointer in the store is corrupt: '{}'",
                        v->substr(0, 100));
    if (theirs != nranks) {
      Status s = make_error(Code::kInvalidArgument,
                            "nRanks is {} here but {} on rank {} (the coordinator): every member "
                            "must pass the same",
                            nranks, theirs, coordinator);
      job->publish_creation_failure(rec.uid, s);  // the others stop waiting for this rank
      return s;
    }
  }
  log_info("grow: rank {} of {} -> of {} (newcomers' job ranks from {})", rank_, size(), nranks,
           base);
  auto c =
      CommImpl::create(job, rec.prefix, rec.uid, rank_, grown_job_ranks(job_ranks_, base, nranks),
                       deadline, t, origin, rec.deterministic);
  if (c.is_ok() && id) (void)store.set(record_key(id->token) + "/done", "1");
  return c;
}

Result<std::shared_ptr<CommImpl>> CommImpl::join_grow(const GrowId& id, int nranks, int rank,
                                                      double timeout_s, int deterministic) {
  CHORUS_TRY(check_grow_id(id));
  CHORUS_TRY(check_size(nranks, id.old_size));
  if (rank < id.old_size || rank >= nranks)
    return make_error(Code::kInvalidArgument,
                      "a newcomer's rank is {}, expected {}..{} (the members keep 0..{})", rank,
                      id.old_size, nranks - 1, id.old_size - 1);
  double t = timeout_s;
  std::string origin = "the communicator's config";
  if (t <= 0) {
    CHORUS_ASSIGN_OR_RETURN(t, env_timeout());
    origin = "CHORUS_TIMEOUT";
  }
  const auto deadline = Deadline::after_seconds(t);
  transport::Rendezvous rdzv;
  rdzv.method = "grow";
  rdzv.rank = id.base + (rank - id.old_size);
  rdzv.size = id.base + (nranks - id.old_size);
  rdzv.local_rank = rank;
  rdzv.secret = id.secret;
  rdzv.secret_origin = "the grow id";
  rdzv.store_host_rank = -1;
  rdzv.store = {std::string(id.host), id.port};
  rdzv.joining = true;
  CHORUS_ASSIGN_OR_RETURN(auto job, Job::create(std::move(rdzv), deadline));
  set_log_rank(rank);
  auto& store = job->store();
  auto v = store.get(record_key(id.token), deadline);
  if (!v.is_ok() && v.status().code() == Code::kTimeout)
    return make_error(Code::kTimeout,
                      "the members did not start this grow within {:g} s ({}): the coordinator "
                      "calls chorusCommGrow with the id, the other members with NULL",
                      t, origin);
  if (!v.is_ok()) return v.status();
  if (store.try_get(record_key(id.token) + "/done").is_ok())
    return make_error(Code::kInvalidUsage,
                      "this grow id was used by a grow that has finished (each grow takes a new "
                      "one from chorusCommGetUniqueId)");
  CHORUS_ASSIGN_OR_RETURN(GrowRecord rec, decode_grow_record(*v, id));
  if (rec.nranks != nranks) {
    Status s = make_error(Code::kInvalidArgument,
                          "nRanks is {} here but {} at the members: every rank must pass the same",
                          nranks, rec.nranks);
    job->publish_creation_failure(rec.uid, s);
    return s;
  }
  log_info("grow: joining as rank {} of {} (job rank {})", rank, nranks,
           id.base + rank - id.old_size);
  return CommImpl::create(job, rec.prefix, rec.uid, rank,
                          grown_job_ranks(rec.job_ranks, id.base, nranks), deadline, t, origin,
                          deterministic >= 0 ? deterministic : rec.deterministic);
}

}  // namespace chorus
