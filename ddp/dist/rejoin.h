// Rejoining a running elastic job (chorus-run --elastic --max-restarts): a restarted worker and
// the running ones meet through a directory chorus-run makes for the job (CHORUS_ELASTIC_DIR).
//
//   restarted worker                        running ranks (at a step boundary)
//   writes join-<pid>           ------>     rank 0 counts the requests, tells the others (the
//                                           trainer broadcasts the count), writes each newcomer
//   reads grant-<pid>: grow id, <------     a grant (grow id, new size, its rank), removes the
//   new size, rank                          request; all call chorusCommGrow
//   chorusCommGrow(NULL, ...)   <------>    ... and the new communicator exists on all.
//
// When the job is over rank 0 writes `finished`: a worker still waiting leaves without joining.
// Files are written whole and renamed into place. One node (the directory is local).
#pragma once

#include <optional>
#include <string>

#include "chorus/chorus.hpp"

namespace chorus {

// CHORUS_ELASTIC_DIR, or "" outside chorus-run --elastic --max-restarts.
std::string elastic_dir();
// CHORUS_ELASTIC_REJOIN: > 0 in a worker chorus-run restarted to rejoin; 0 otherwise.
int elastic_rejoin_count();

// Rank 0: how many restarted workers wait to join.
int count_join_requests(const std::string& dir);
// Every running rank, after rank 0 counted n > 0: rank 0 grants the first n requests, then all
// grow the communicator by n (members keep their ranks).
Communicator grant_and_grow(Communicator& comm, const std::string& dir, int n);
// A restarted worker: asks to join and waits (up to timeout_s) for a grant; the grown
// communicator, or nothing when the job finished first.
std::optional<Communicator> request_join(const std::string& dir, double timeout_s);
// Rank 0 at the end of training: workers still waiting leave.
void announce_finished(const std::string& dir);

}  // namespace chorus
