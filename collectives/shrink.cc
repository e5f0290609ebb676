// chorusCommShrink: a new communicator of the survivors of this one (as NCCL's ncclCommShrink),
// and the agreement on who they are when the library is to find the failed ranks itself.
//
// The survivors' new communicator is created like a split's, through the bootstrap store, with
// new links: whatever state the old links were left in by the failure does not matter. Every
// survivor must call shrink the same number of times (with split, it numbers the new
// communicator's store keys).
//
// Agreement (CHORUS_SHRINK_AGREE). Goal: every survivor leaves with the same excluded set E,
// which contains every rank known to have failed, even when ranks die during the agreement.
// Assumes: the bootstrap store and its watch channel are alive (the store's host is not among
// the dead); a rank is dead once the store saw its watch connection close without a goodbye,
// and the store delivers a rank's requests before the news of its death (one TCP connection
// each, served in order); a rank alive but stuck is treated as failed after 80% of the
// timeout. Protocol, in rounds keyed by the shrink's number:
//   1. each survivor publishes its view: the ranks it wants excluded (the caller's list and
//      every rank it has heard died);
//   2. the leader is the lowest rank that is neither known dead nor excluded in this rank's
//      view; everyone else waits for the leader's decision (or its death: then the next
//      lowest leads);
//   3. the leader waits until every rank has published a view or is known dead (or 80% of the
//      timeout passed), then, unless a decision is already there (a previous leader wrote it
//      before dying: the store holds it before it announces that death, so the new leader sees
//      it), writes the decision: the union of all views, every rank without a view and every
//      rank known dead now;
//   4. everyone adopts the decision. One decision is ever written per round, so all agree.
// A rank that dies after the decision is a member of the new communicator: its creation fails
// on every survivor naming that rank, and they shrink again (the next round).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

#include "collectives/comm.h"
#include "collectives/job.h"
#include "common/env.h"
#include "common/log.h"
#include "transport/wire.h"

namespace chorus {
namespace {

std::string encode_set(const std::set<int>& s) {
  std::string out;
  for (int r : s) out += fmt::format("{}{}", out.empty() ? "" : " ", r);
  return out.empty() ? "-" : out;
}

Result<std::set<int>> decode_set(const std::string& v, int size, const std::string& what) {
  std::set<int> out;
  if (v == "-") return out;
  std::istringstream in(v);
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    long r = std::strtol(tok.c_str(), &end, 10);
    if (*end != '\0' || r < 0 || r >= size)
      return make_error(Code::kRemoteError, "shrink: {} holds '{}', not a rank of 0..{}", what, tok,
                        size - 1);
    out.insert(static_cast<int>(r));
  }
  return out;
}

// Test hook CHORUS_TEST_SHRINK_DIE="rank:point": that rank kills itself at that point of the
// agreement ("view": before publishing its view, "decide": as leader, before the decision).
struct DieHook {
  int rank = -1;
  std::string point;
};

Result<DieHook> die_hook() {
  const std::string v = env_str("CHORUS_TEST_SHRINK_DIE", "");
  DieHook h;
  if (v.empty()) return h;
  char point[16] = {};
  int end = 0;
  if (std::sscanf(v.c_str(), "%d:%15[a-z]%n", &h.rank, point, &end) != 2 ||
      static_cast<size_t>(end) != v.size() || h.rank < 0 ||
      (std::string(point) != "view" && std::string(point) != "decide"))
    return make_error(Code::kInvalidArgument,
                      "CHORUS_TEST_SHRINK_DIE='{}': expected RANK:view or RANK:decide", v);
  h.point = point;
  return h;
}

void maybe_die(const DieHook& h, int rank, const char* point) {
  if (h.rank != rank || h.point != point) return;
  log_warn("rank {}: CHORUS_TEST_SHRINK_DIE={}:{}: killing myself", rank, h.rank, h.point);
  raise(SIGKILL);
}

}  // namespace

Result<std::set<int>> CommImpl::agree_on_failed(const std::set<int>& mine, const std::string& round,
                                                Deadline deadline) {
  auto& store = job_->store();
  const std::string base = fmt::format("{}/shrink{}", prefix_, round);
  auto dead = [&](int r) { return !job_->dead_text(job_ranks_[r]).empty(); };
  CHORUS_ASSIGN_OR_RETURN(DieHook hook, die_hook());
  std::set<int> view = mine;
  for (int r = 0; r < size(); ++r)
    if (dead(r)) view.insert(r);
  maybe_die(hook, rank_, "view");
  CHORUS_TRY(store.set(fmt::format("{}/view/{}", base, rank_), encode_set(view)));
  const double budget = std::max(0.5, deadline.remaining() * 0.8);
  const Deadline leader_deadline = Deadline::after_seconds(budget);
  const std::string decision_key = fmt::format("{}/decision", base);
  // Waits for a key in 20 ms slices, so a death (stop()) ends the wait within one slice.
  auto wait_key = [&](const std::string& key, Deadline limit,
                      const std::function<Status()>& stop) -> Result<std::string> {
    while (true) {
      auto v = store.get(key, Deadline::after_seconds(std::min(0.02, limit.remaining())));
      if (v.is_ok() || v.status().code() != Code::kTimeout) return v;
      CHORUS_TRY(stop());
      if (limit.expired()) return v;
    }
  };
  while (true) {
    int leader = -1;
    for (int r = 0; r < size() && leader < 0; ++r)
      if (!dead(r) && !view.count(r)) leader = r;
    if (leader < 0)
      return make_error(Code::kInternalError, "shrink: every rank is excluded or dead");
    if (leader != rank_) {
      auto d = wait_key(decision_key, deadline, [&]() -> Status {
        if (dead(leader)) return make_error(Code::kRemoteError, "leader {} died", leader);
        return Status::ok();
      });
      if (d.is_ok()) return decode_set(*d, size(), "the decision");
      if (deadline.expired() || !dead(leader)) return d.status().wrap("shrink: agreement");
      view.insert(leader);  // it died: the next lowest leads
      continue;
    }
    // Leader: every rank's view, or its death.
    std::set<int> decision = view, missing;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_ || view.count(r)) continue;  // excluded by us already: no need to wait
      auto v = wait_key(fmt::format("{}/view/{}", base, r), leader_deadline, [&]() -> Status {
        return dead(r) ? make_error(Code::kRemoteError, "rank {} died", r) : Status::ok();
      });
      if (!v.is_ok() && v.status().code() != Code::kTimeout && !dead(r)) return v.status();
      if (!v.is_ok()) {  // dead (added below), or silent for 80% of the timeout
        if (!dead(r)) missing.insert(r);
        continue;
      }
      CHORUS_ASSIGN_OR_RETURN(auto theirs,
                              decode_set(*v, size(), fmt::format("rank {}'s view", r)));
      decision.insert(theirs.begin(), theirs.end());
    }
    for (int r = 0; r < size(); ++r)
      if (dead(r)) decision.insert(r);
    decision.insert(missing.begin(), missing.end());
    maybe_die(hook, rank_, "decide");
    auto earlier = store.try_get(decision_key);
    if (earlier.is_ok()) return decode_set(*earlier, size(), "the decision");
    CHORUS_TRY(store.set(decision_key, encode_set(decision)));
    if (!missing.empty())
      log_warn("shrink: rank {} (leader): no view from rank(s) {} within {:.1f} s: excluded", rank_,
               encode_set(missing), budget);
    return decision;
  }
}

Result<std::shared_ptr<CommImpl>> CommImpl::shrink(const std::vector<int>& exclude, bool agree,
                                                   double timeout_s, int deterministic) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, job_unless_stopping("shrink"));
  std::set<int> excluded;
  for (int r : exclude) {
    if (r < 0 || r >= size())
      return make_error(Code::kInvalidArgument,
                        "shrink: excluded rank {} is not a rank of this communicator (0..{})", r,
                        size() - 1);
    if (!excluded.insert(r).second)
      return make_error(Code::kInvalidArgument, "shrink: rank {} is excluded twice", r);
  }
  if (excluded.count(rank_))
    return make_error(Code::kInvalidUsage,
                      "shrink: rank {} is in its own exclude list (an excluded rank does not call "
                      "shrink)",
                      rank_);
  const uint64_t n = ++split_count_;
  const double t = timeout_s > 0 ? timeout_s : timeout_s_;
  const std::string origin = timeout_s > 0 ? "the communicator's config" : timeout_origin_;
  auto deadline = Deadline::after_seconds(t);
  // The store is needed throughout: when its process dies, the survivors move to a new one
  // (failover.cc), and everyone in the shrink starts it over there, under keys and a name that
  // carry the new store's generation (the old store's keys are gone).
  while (true) {
    if (Status up = job->await_store(deadline); !up.is_ok())
      return make_error(up.code(), "shrink: {}", up.message());
    const int gen = job->store_generation();
    const std::string tag = gen > 0 ? fmt::format("f{}", gen) : "";
    auto c = shrink_once(excluded, agree, n, tag, t, origin, deterministic, deadline);
    // A request that failed on the store's connection waits for the watch channel's news of
    // it: its reader may be held a while on a loaded machine (up to 5 s, or the deadline).
    if (c.is_ok() || deadline.expired() ||
        !job->store_moved_since(gen, std::min(5.0, deadline.remaining()))) {
      if (c.is_ok()) return c;
      if (std::string gone = job->store_gone_text(); !gone.empty())
        return make_error(Code::kRemoteError, "shrink: {}: {}", gone, c.status().message());
      return c.status();
    }
    log_warn(
        "shrink: rank {}: the bootstrap store failed during the shrink ({}); starting over "
        "on its successor",
        rank_, c.status().message());
  }
}

Result<std::shared_ptr<CommImpl>> CommImpl::shrink_once(std::set<int> excluded, bool agree,
                                                        uint64_t n, const std::string& tag,
                                                        double t, const std::string& origin,
                                                        int deterministic, Deadline deadline) {
  if (agree) {
    CHORUS_ASSIGN_OR_RETURN(excluded,
                            agree_on_failed(excluded, fmt::format("{}{}", n, tag), deadline));
    if (excluded.count(rank_))
      return make_error(Code::kRemoteError,
                        "shrink: the survivors agreed to exclude this rank ({}) too: {}", rank_,
                        encode_set(excluded));
  }
  std::vector<int> job_ranks;
  int new_rank = -1;
  for (int r = 0; r < size(); ++r) {
    if (excluded.count(r)) continue;
    if (r == rank_) new_rank = static_cast<int>(job_ranks.size());
    job_ranks.push_back(job_ranks_[r]);
  }
  log_info("shrink: rank {} -> rank {} of {} (excluded: {})", rank_, new_rank, job_ranks.size(),
           encode_set(excluded));
  std::string prefix = child_prefix(fmt::format(".k{}{}", n, tag));
  uint64_t uid = transport::hash64(prefix.data(), prefix.size(), uid_);
  return CommImpl::create(job_, prefix, uid, new_rank, job_ranks, deadline, t, origin,
                          deterministic >= 0 ? deterministic : (tuner_.deterministic ? 1 : 0));
}

}  // namespace chorus
