// libFuzzer target: the 48-byte header a peer sends ahead of every operation
// (collectives/op.cc: check_header, and the mismatch message built from the peer's bytes).
//
// Input: the received header's bytes (48), then bytes that choose what this rank is doing.
// Besides crashes, it checks the contract: an accepted header matches this rank's call field for
// field, and a mismatch message names both ranks and lets a reader tell the two calls apart.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "collectives/op.h"

namespace {

using chorus::OpDesc;
using chorus::OpHeader;
using chorus::OpKind;

constexpr uint64_t kCommUid = 0x6368'6f72'7573'0001ull;

void fail(const char* what, const std::string& message) {
  std::fprintf(stderr, "op_header: %s\nmessage: %s\n", what, message.c_str());
  std::abort();
}

// What this rank is doing, drawn from the values the library itself produces. Never a send:
// only receivers check headers (a send's header goes one way).
OpDesc my_call(FuzzedDataProvider& in, int me) {
  OpDesc d;
  d.kind = static_cast<OpKind>(in.ConsumeIntegralInRange<int>(2, 12));  // barrier .. all_to_all_v
  d.seq = in.ConsumeIntegral<uint64_t>();
  d.count = in.ConsumeIntegral<uint64_t>();
  d.dtype = in.ConsumeIntegralInRange<int>(0, chorusNumTypes - 1);
  d.root = in.ConsumeIntegralInRange<int>(-1, 7);
  d.redop = in.ConsumeIntegralInRange<int>(-1, 4);
  d.peer = in.ConsumeIntegralInRange<int>(0, 7);
  d.tag = in.ConsumeIntegral<int32_t>();
  d.algo = static_cast<chorus::Algo>(in.ConsumeIntegralInRange<int>(0, 4));
  d.piece = in.ConsumeIntegral<uint32_t>();
  d.nchannels = in.ConsumeIntegralInRange<int>(1, 8);
  if (d.peer == me) d.peer = (me + 1) % 8;
  return d;
}

// "send #3 to rank 1 (...)" and "recv #3 from rank 0 (...)" both become "p2p #3 (...)", so a
// send and the recv it meets compare equal when they agree on everything else.
std::string without_direction(std::string call) {
  for (const char* kind : {"send #", "recv #"})
    if (call.rfind(kind, 0) == 0) call.replace(0, 4, "p2p");
  for (const char* dir : {" to rank ", " from rank "}) {
    size_t at = call.find(dir);
    if (at == std::string::npos) continue;
    size_t end = call.find(' ', at + std::strlen(dir));
    call.erase(at, end - at);
  }
  return call;
}

// The message is "<call> on rank A vs <call> on rank B[ (what differs)]".
void check_mismatch_message(const std::string& m, int from, int me) {
  int low = from < me ? from : me, high = from < me ? me : from;
  std::string on_low = " on rank " + std::to_string(low) + " vs ";
  std::string on_high = " on rank " + std::to_string(high);
  size_t a_end = m.find(on_low);
  size_t b_end = m.find(on_high, a_end == std::string::npos ? 0 : a_end + on_low.size());
  if (a_end == std::string::npos || b_end == std::string::npos)
    fail("a mismatch message must name both ranks, lower first", m);
  std::string a = m.substr(0, a_end);
  std::string b = m.substr(a_end + on_low.size(), b_end - a_end - on_low.size());
  bool explained = m.size() > b_end + on_high.size() && m.back() == ')';
  bool send_meets_recv = (a.rfind("send #", 0) == 0 && b.rfind("recv #", 0) == 0) ||
                         (a.rfind("recv #", 0) == 0 && b.rfind("send #", 0) == 0);
  bool alike = send_meets_recv ? without_direction(a) == without_direction(b) : a == b;
  if (alike && !explained) fail("a mismatch message must show what differs", m);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CHORUS_DEBUG", "NONE", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  OpHeader got{};
  std::memcpy(&got, data, size < sizeof got ? size : sizeof got);
  FuzzedDataProvider in(data + (size < sizeof got ? size : sizeof got),
                        size < sizeof got ? 0 : size - sizeof got);
  int me = in.ConsumeIntegralInRange<int>(0, 7);
  int from = in.ConsumeIntegralInRange<int>(0, 7);
  if (from == me) from = (me + 1) % 8;
  OpDesc mine = my_call(in, me);

  // The header a correct peer would send for the same call is accepted.
  OpDesc peer_call = mine;
  if (mine.kind == OpKind::kRecv) peer_call.kind = OpKind::kSend;
  chorus::Status own = chorus::check_header(chorus::make_header(peer_call, from, kCommUid), from,
                                            mine, me, kCommUid);
  if (!own.is_ok()) fail("a correct peer's header was refused", own.message());

  chorus::Status s = chorus::check_header(got, from, mine, me, kCommUid);
  if (s.is_ok()) {
    OpHeader want = chorus::make_header(peer_call, from, kCommUid);
    got.reserved = want.reserved;  // not compared: free for later use
    if (std::memcmp(&got, &want, sizeof got) != 0) fail("a different header was accepted", "");
    return 0;
  }
  if (s.message().empty()) fail("an error without a message", "");
  if (s.code() == chorus::Code::kMismatch)
    check_mismatch_message(s.message(), from, me);
  else if (s.code() != chorus::Code::kRemoteError)
    fail("unexpected error code", s.message());
  return 0;
}
