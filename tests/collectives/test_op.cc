// The operation header check (collectives/op.cc) on its own: what a mismatch message says.
#include <catch2/catch.hpp>

#include "collectives/op.h"

using namespace chorus;

namespace {

constexpr uint64_t kUid = 42;

OpDesc all_reduce() {
  OpDesc d;
  d.kind = OpKind::kAllReduce;
  d.seq = 7;
  d.count = 1000;
  d.dtype = chorusFloat32;
  d.redop = chorusSum;
  d.algo = Algo::kRing;
  d.piece = 65536;
  d.nchannels = 2;
  return d;
}

}  // namespace

TEST_CASE("a matching header passes, and one field off is a mismatch naming both ranks", "[op]") {
  OpDesc mine = all_reduce();
  REQUIRE(check_header(make_header(mine, 1, kUid), 1, mine, 0, kUid).is_ok());
  OpDesc theirs = mine;
  theirs.count = 999;
  Status s = check_header(make_header(theirs, 1, kUid), 1, mine, 0, kUid);
  CHECK(s.code() == Code::kMismatch);
  CHECK(s.message() ==
        "all_reduce #7 (count 1000 f32, sum, ring) on rank 0 vs "
        "all_reduce #7 (count 999 f32, sum, ring) on rank 1");
}

// Found by fuzz/op_header: calls that differed only in a field describe() does not print
// (channels, a broadcast's piece) read alike, and the message blamed CHORUS_CHUNK_BYTES.
TEST_CASE("calls that read alike: the message names the fields that differ, lower rank first",
          "[op][fuzz]") {
  OpDesc mine = all_reduce();
  OpDesc theirs = mine;
  theirs.nchannels = 1;
  Status s = check_header(make_header(theirs, 0, kUid), 0, mine, 3, kUid);
  CHECK(s.code() == Code::kMismatch);
  CHECK(s.message() ==
        "all_reduce #7 (count 1000 f32, sum, ring) on rank 0 vs "
        "all_reduce #7 (count 1000 f32, sum, ring) on rank 3 "
        "(channels 1 vs 2 (CHORUS_NCHANNELS differs between ranks))");

  theirs = mine;
  theirs.piece = 4096;
  s = check_header(make_header(theirs, 5, kUid), 5, mine, 3, kUid);
  CHECK(s.message() ==
        "all_reduce #7 (count 1000 f32, sum, ring) on rank 3 vs "
        "all_reduce #7 (count 1000 f32, sum, ring) on rank 5 "
        "(piece bytes 65536 vs 4096 (CHORUS_CHUNK_BYTES differs between ranks))");

  OpDesc recv;
  recv.kind = OpKind::kRecv;
  recv.seq = 2;
  recv.count = 5;
  recv.peer = 1;
  recv.tag = 9;
  OpDesc send = recv;
  send.kind = OpKind::kSend;
  send.redop = 3;  // a send/recv header carries no op: a corrupt peer's
  s = check_header(make_header(send, 1, kUid), 1, recv, 0, kUid);
  CHECK(s.message() ==
        "recv #2 from rank 1 (count 5 u8, tag 9) on rank 0 vs "
        "send #2 to rank 0 (count 5 u8, tag 9) on rank 1 (op none vs min)");
}

TEST_CASE("a header from another communicator or with a bad magic is corrupt, not a mismatch",
          "[op]") {
  OpDesc mine = all_reduce();
  Status s = check_header(make_header(mine, 1, kUid + 1), 1, mine, 0, kUid);
  CHECK(s.code() == Code::kRemoteError);
  CHECK_THAT(s.message(), Catch::Contains("corrupt header from rank 1"));
}

TEST_CASE(
    "gather, scatter and all-to-all describe themselves; an all-to-all-v pair names both "
    "counts",
    "[op]") {
  OpDesc g;
  g.kind = OpKind::kGather;
  g.seq = 4;
  g.count = 13;
  g.dtype = chorusInt8;
  g.root = 2;
  CHECK(describe(g) == "gather #4 (count 13 i8, root 2)");
  OpDesc sc = g;
  sc.kind = OpKind::kScatter;
  Status s = check_header(make_header(sc, 1, kUid), 1, g, 0, kUid);
  CHECK(s.message() ==
        "gather #4 (count 13 i8, root 2) on rank 0 vs scatter #4 (count 13 i8, root 2) on rank 1");
  OpDesc a2a = g;
  a2a.kind = OpKind::kAllToAll;
  CHECK(describe(a2a) == "all_to_all #4 (count 13 i8)");

  // Rank 3 sends rank 1 five elements; rank 1 expects four from rank 3.
  OpDesc expects;
  expects.kind = OpKind::kAllToAllv;
  expects.seq = 9;
  expects.count = 4;
  expects.dtype = chorusInt32;
  expects.peer = 3;
  CHECK(describe(expects) == "all_to_all_v #9 (i32)");
  OpDesc sends = expects;
  sends.count = 5;
  sends.peer = 1;
  REQUIRE(check_header(make_header(expects, 3, kUid), 3, expects, 1, kUid).is_ok());
  s = check_header(make_header(sends, 3, kUid), 3, expects, 1, kUid);
  CHECK(s.code() == Code::kMismatch);
  CHECK(s.message() ==
        "all_to_all_v #9 (i32, expects 4 from rank 3) on rank 1 vs all_to_all_v #9 (i32, sends 5 "
        "to rank 1) on rank 3");
}
