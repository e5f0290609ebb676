// The ib backend below the collectives: CHORUS_IB_HCA, queue pair addresses, the emulated
// verbs (and the errors they report), the registration cache, and the link's slot and credit
// protocol between two links of one process. [ib]: the real verbs, where a port is active.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "transport/ib/hca.h"
#include "transport/ib/link.h"
#include "transport/ib/reg_cache.h"
#include "transport/ib/verbs.h"

using namespace chorus::transport;
using namespace chorus::transport::ib;

namespace {

std::shared_ptr<Nic> emu_nic() {
  auto n = emu_open_nic(Port{"emu0", 1, true, false});
  REQUIRE(n.is_ok());
  return *n;
}

}  // namespace

TEST_CASE("CHORUS_IB_HCA: NCCL's syntax, and clear errors", "[ib][hca]") {
  auto f = parse_hca("mlx5_0:1,mlx5_1");
  REQUIRE(f.is_ok());
  CHECK(f->allows("mlx5_0", 1));
  CHECK_FALSE(f->allows("mlx5_0", 2));
  CHECK(f->allows("mlx5_10", 1));  // prefix match
  CHECK(f->allows("mlx5_1", 2));
  CHECK_FALSE(f->allows("mlx4_0", 1));
  auto exact = parse_hca("=mlx5_1");
  REQUIRE(exact.is_ok());
  CHECK(exact->allows("mlx5_1", 1));
  CHECK_FALSE(exact->allows("mlx5_10", 1));
  auto ex = parse_hca("^=mlx5_2:1");
  REQUIRE(ex.is_ok());
  CHECK_FALSE(ex->allows("mlx5_2", 1));
  CHECK(ex->allows("mlx5_2", 2));
  CHECK(ex->allows("mlx5_0", 1));
  CHECK(parse_hca("")->allows("anything", 3));
  for (const char* bad :
       {"^", "^=", "mlx5_0:0", "mlx5_0:256", "mlx5_0:x", "a,,b", "mlx 5", ":1", "mlx5_0:"}) {
    INFO(bad);
    auto r = parse_hca(bad);
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains("CHORUS_IB_HCA"));
  }
  std::vector<Port> ports{
      {"mlx5_0", 1, false, false}, {"mlx5_1", 1, true, true}, {"mlx5_2", 1, true, false}};
  auto chosen = choose_ports(ports, *parse_hca("^mlx5_1"), "^mlx5_1");
  REQUIRE(chosen.is_ok());
  REQUIRE(chosen->size() == 1);
  CHECK(chosen->front().name() == "mlx5_2:1");
  auto none = choose_ports(ports, *parse_hca("mlx5_0"), "mlx5_0");
  REQUIRE_FALSE(none.is_ok());
  CHECK_THAT(none.status().message(), Catch::Contains("mlx5_0:1 (down)") &&
                                          Catch::Contains("mlx5_1:1 (not in CHORUS_IB_HCA)"));
}

TEST_CASE("queue pair addresses travel through the store and are checked", "[ib]") {
  QpAddr a;
  a.qpn = 0xabcdef;
  a.psn = 12345;
  a.lid = 7;
  for (int i = 0; i < 16; ++i) a.gid[i] = static_cast<uint8_t>(i * 17);
  auto b = QpAddr::decode(a.encode());
  REQUIRE(b.is_ok());
  CHECK(b->qpn == a.qpn);
  CHECK(b->psn == a.psn);
  CHECK(b->lid == a.lid);
  CHECK(b->gid == a.gid);
  for (const char* bad :
       {"", "1 2 3", "16777216 0 0 00000000000000000000000000000000",
        "1 2 70000 00000000000000000000000000000000", "1 2 3 0000000000000000000000000000000",
        "1 2 3 00000000000000000000000000000000 x"}) {
    INFO(bad);
    CHECK_FALSE(QpAddr::decode(bad).is_ok());
  }
}

TEST_CASE("a peer's queue pair record: round trip, and malformed ones named", "[ib]") {
  QpRecord r;
  r.qp.qpn = 9;
  r.slots = {0x7f0000001000, 77};
  r.slot_bytes = 65536;
  r.nslots = 4;
  auto back = QpRecord::decode(r.encode(), 3);
  REQUIRE(back.is_ok());
  CHECK((back->slots.addr == r.slots.addr && back->slots.rkey == 77 && back->nslots == 4 &&
         back->slot_bytes == 65536 && back->qp.qpn == 9));
  for (std::string bad : {std::string(""), r.encode() + " 1", r.qp.encode() + "|1 2 3",
                          r.qp.encode() + "|1 4294967296 3 4", r.qp.encode() + "|-1 2 3 4",
                          std::string("x|1 2 3 4")}) {
    INFO(bad);
    auto d = QpRecord::decode(bad, 3);
    REQUIRE_FALSE(d.is_ok());
    CHECK_THAT(d.status().message(), Catch::Contains("rank 3"));
  }
}

TEST_CASE("emulated verbs: writes with immediate land, and every error real verbs report",
          "[ib][emu]") {
  auto a = emu_nic(), b = emu_nic();
  QpAddr qa, qb;
  int qpa = *a->create_qp(4, &qa), qpb = *b->create_qp(4, &qb);
  char* region = *b->alloc_remote(8192);
  Mr rmr = *b->reg(region, 8192, true);
  REQUIRE(a->connect_qp(qpa, qb).is_ok());
  REQUIRE(b->connect_qp(qpb, qa).is_ok());
  REQUIRE(a->expect_writes(qpa, rmr.rkey).is_ok());
  std::vector<char> src(4096);
  std::iota(src.begin(), src.end(), 0);
  Mr lmr = *a->reg(src.data(), src.size(), false);
  Wc wc[8];

  SECTION("a write lands before its immediate is seen; the send completes") {
    REQUIRE(b->post_recv(qpb, 77).is_ok());
    uint32_t seen = b->arm();
    REQUIRE(
        a->post_write_imm(qpa, 5, lmr, src.data() + 10, 100, uint64_t(region) + 200, rmr.rkey, 42)
            .is_ok());
    CHECK(b->rung_since(seen));  // the doorbell rang
    b->disarm();
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK((wc[0].wr_id == 5 && !wc[0].recv && wc[0].status == kWcSuccess));
    REQUIRE(b->poll(qpb, wc, 8) == 1);
    CHECK((wc[0].wr_id == 77 && wc[0].recv && wc[0].imm == 42 && wc[0].bytes == 100));
    CHECK(std::memcmp(region + 200, src.data() + 10, 100) == 0);
  }
  SECTION("unregistered source: local protection error, then flushed") {
    REQUIRE(b->post_recv(qpb, 1).is_ok());
    std::vector<char> other(64);
    REQUIRE(
        a->post_write_imm(qpa, 1, lmr, other.data(), 64, uint64_t(region), rmr.rkey, 0).is_ok());
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK(wc[0].status == kWcLocProtErr);
    REQUIRE(a->post_write_imm(qpa, 2, lmr, src.data(), 64, uint64_t(region), rmr.rkey, 0).is_ok());
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK(wc[0].status == kWcWrFlushErr);
    CHECK(std::string(wc_status_name(kWcWrFlushErr)) == "work request flushed error");
  }
  SECTION("outside the remote region or a wrong key: remote access error") {
    REQUIRE(b->post_recv(qpb, 1).is_ok());
    REQUIRE(a->post_write_imm(qpa, 1, lmr, src.data(), 64, uint64_t(region) + 8190, rmr.rkey, 0)
                .is_ok());
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK(wc[0].status == kWcRemAccessErr);
  }
  SECTION("no receive posted: receiver not ready") {
    REQUIRE(a->post_write_imm(qpa, 1, lmr, src.data(), 64, uint64_t(region), rmr.rkey, 0).is_ok());
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK(wc[0].status == kWcRnrRetryExcErr);
  }
  SECTION("the peer's queue pair is gone: retry exceeded") {
    REQUIRE(b->post_recv(qpb, 1).is_ok());
    b->destroy_qp(qpb);
    REQUIRE(a->post_write_imm(qpa, 1, lmr, src.data(), 64, uint64_t(region), rmr.rkey, 0).is_ok());
    REQUIRE(a->poll(qpa, wc, 8) == 1);
    CHECK(wc[0].status == kWcRetryExcErr);
  }
  SECTION("the send queue has a depth") {
    for (int i = 0; i < 4; ++i) REQUIRE(b->post_recv(qpb, i).is_ok());
    for (int i = 0; i < 4; ++i)
      REQUIRE(a->post_write_imm(qpa, i, lmr, src.data(), 8, uint64_t(region), rmr.rkey, 0).is_ok());
    CHECK_FALSE(
        a->post_write_imm(qpa, 9, lmr, src.data(), 8, uint64_t(region), rmr.rkey, 0).is_ok());
    CHECK_FALSE(b->post_recv(qpb, 99).is_ok());  // four posted, none taken off yet
    REQUIRE(a->poll(qpa, wc, 8) == 4);
    REQUIRE(b->poll(qpb, wc, 8) == 4);
    REQUIRE(b->post_recv(qpb, 99).is_ok());
    CHECK(a->post_write_imm(qpa, 9, lmr, src.data(), 8, uint64_t(region), rmr.rkey, 0).is_ok());
  }
  a->dereg(lmr);
}

TEST_CASE("registration cache: one registration per buffer, least recently used out first",
          "[ib][reg_cache]") {
  auto nic = emu_nic();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<char> raw(65 * page);
  char* aligned = raw.data() + (page - reinterpret_cast<uintptr_t>(raw.data()) % page) % page;
  struct {
    char* p;
    char* data() const { return p; }
  } mem{aligned};
  RegCache cache(nic.get(), 8 * page);
  auto e1 = cache.acquire(mem.data() + 10, 3 * page);
  REQUIRE(e1.is_ok());
  CHECK((*e1)->mr.covers(mem.data() + 10, 3 * page));
  cache.release(*e1);
  for (int i = 0; i < 5; ++i) {  // the same buffer, and a part of it: hits
    auto again = cache.acquire(mem.data() + 10 + i, 3 * page - i);
    REQUIRE(again.is_ok());
    CHECK(*again == *e1);
    cache.release(*again);
  }
  CHECK(cache.stats().misses == 1);
  CHECK(cache.stats().hits == 5);
  auto held = cache.acquire(mem.data() + 20 * page, 4 * page);  // in use: never evicted
  REQUIRE(held.is_ok());
  auto e3 = cache.acquire(mem.data() + 40 * page, 4 * page);  // over budget: e1 goes, not held
  REQUIRE(e3.is_ok());
  cache.release(*e3);
  CHECK(cache.stats().evictions == 1);
  CHECK(cache.stats().bytes <= 8 * page);
  auto back = cache.acquire(mem.data() + 20 * page + 5, 100);
  REQUIRE(back.is_ok());
  CHECK(*back == *held);
  cache.release(*back);
  cache.release(*held);
}

namespace {

// Two links of one process, connected through two emulated Nics.
struct Pair {
  std::shared_ptr<Nic> na = emu_nic(), nb = emu_nic();
  std::unique_ptr<IbLink> a, b;
  explicit Pair(const LinkConfig& cfg) {
    QpAddr qa, qb;
    SlotsAddr sa, sb;
    auto la = IbLink::create(1, "rank 1 (test)", na, na.get(), cfg, &qa, &sa);
    auto lb = IbLink::create(0, "rank 0 (test)", nb, nb.get(), cfg, &qb, &sb);
    REQUIRE(la.is_ok());
    REQUIRE(lb.is_ok());
    a = std::move(*la);
    b = std::move(*lb);
    REQUIRE(na->connect_qp(a->qp(), qb).is_ok());
    REQUIRE(nb->connect_qp(b->qp(), qa).is_ok());
    REQUIRE(na->expect_writes(a->qp(), sb.rkey).is_ok());
    REQUIRE(nb->expect_writes(b->qp(), sa.rkey).is_ok());
    a->set_remote(sb);
    b->set_remote(sa);
  }
  // Drives both until the tickets complete (bounded).
  void run(uint64_t sa_t, uint64_t rb_t, bool a_sends = true) {
    for (int i = 0; i < 1000000; ++i) {
      auto x = a->progress();
      auto y = b->progress();
      REQUIRE(x.is_ok());
      REQUIRE(y.is_ok());
      if (a_sends ? (a->send_done(sa_t) && b->recv_done(rb_t))
                  : (b->send_done(sa_t) && a->recv_done(rb_t)))
        return;
    }
    FAIL("link transfer did not finish");
  }
};

}  // namespace

TEST_CASE("ib link: every byte in order through few small slots, both directions", "[ib][link]") {
  auto zc = GENERATE(size_t{0}, size_t{3000});  // staged only; large requests from user memory
  DYNAMIC_SECTION("zero-copy from " << zc << " bytes") {
    LinkConfig cfg{4096, 2, zc, 1 << 20};
    Pair p(cfg);
    std::mt19937 rng(7);
    for (size_t n : {size_t{0}, size_t{1}, size_t{48}, size_t{4095}, size_t{4096}, size_t{4097},
                     size_t{100003}, size_t{1} << 20}) {
      std::vector<char> out(n), in(n, 0);
      for (auto& c : out) c = static_cast<char>(rng());
      // Two requests back to back on each side (packing), and the reverse direction at once.
      std::vector<char> out2(n / 3 + 5), in2(n / 3 + 5);
      for (auto& c : out2) c = static_cast<char>(rng());
      uint64_t s1 = p.a->post_send(out.data(), n);
      uint64_t s2 = p.a->post_send(out2.data(), out2.size());
      uint64_t r1 = p.b->post_recv(in.data(), n);
      uint64_t r2 = p.b->post_recv(in2.data(), in2.size());
      std::vector<char> back(n), back_in(n);
      for (auto& c : back) c = static_cast<char>(rng());
      uint64_t s3 = p.b->post_send(back.data(), n);
      uint64_t r3 = p.a->post_recv(back_in.data(), n);
      p.run(s1, r1);
      p.run(s2, r2);
      p.run(s3, r3, false);
      INFO("n = " << n);
      CHECK(in == out);
      CHECK(in2 == out2);
      CHECK(back_in == back);
    }
    if (zc) {
      // The same user buffer sent again: registered once.
      std::vector<char> buf(50000, 'x'), got(50000);
      for (int i = 0; i < 3; ++i) {
        uint64_t s = p.a->post_send(buf.data(), buf.size());
        uint64_t r = p.b->post_recv(got.data(), got.size());
        p.run(s, r);
      }
      CHECK(p.a->reg_stats().hits >= 2);
      CHECK(got == buf);
    } else {
      CHECK(p.a->reg_stats().misses == 0);
    }
  }
}

TEST_CASE("ib link: direct slots reduce in place; a sender waits for credits", "[ib][link]") {
  LinkConfig cfg{4096, 2, 0, 1 << 20};
  Pair p(cfg);
  int written = 0;
  // Fill every slot the credits allow: the third reservation must wait for the receiver.
  for (int i = 0; i < 3; ++i) {
    auto [buf, cap] = p.a->send_reserve();
    if (!buf) break;
    REQUIRE(cap == 4096);
    std::memset(buf, 'a' + i, 1000);
    p.a->send_commit(1000);
    ++written;
  }
  CHECK(written == 2);
  for (int i = 0; i < 2; ++i) {
    auto [data, n] = p.b->recv_peek();
    REQUIRE(data);
    REQUIRE(n == 1000);
    CHECK(data[0] == 'a' + i);
    CHECK(data[999] == 'a' + i);
    p.b->recv_consume(600);
    auto [rest, m] = p.b->recv_peek();
    REQUIRE(m == 400);
    CHECK(rest == data + 600);
    p.b->recv_consume(400);
  }
  // The consumed slots came back as credits.
  for (int i = 0; i < 100 && !p.a->send_reserve().first; ++i) REQUIRE(p.a->progress().is_ok());
  CHECK(p.a->send_reserve().first != nullptr);
}

// The order a collective step and a posted request can take on one link: a step reserving a slot
// while an earlier posted send has not been written yet, or peeking while a posted receive waits
// for those same bytes, would reorder the stream (seen as "corrupt header" in a 5-rank reduce).
// The posted requests go first, as over shm.
TEST_CASE("ib link: direct slots wait for posted requests on the same link", "[ib][link]") {
  LinkConfig cfg{4096, 2, 0, 1 << 20};
  Pair p(cfg);
  std::vector<char> first(100, 'p'), got(100, 0);
  uint64_t s = p.a->post_send(first.data(), first.size());  // posted, not yet progressed
  CHECK(p.a->send_reserve().first == nullptr);
  REQUIRE(p.a->progress().is_ok());  // written now
  auto [buf, cap] = p.a->send_reserve();
  REQUIRE(buf);
  std::memset(buf, 'd', 50);
  p.a->send_commit(50);
  REQUIRE(p.b->progress().is_ok());  // both messages have arrived
  uint64_t r = p.b->post_recv(got.data(), got.size());
  CHECK(p.b->recv_peek().first == nullptr);  // the posted receive takes the first bytes
  p.run(s, r);
  CHECK(got == first);
  auto [data, n] = p.b->recv_peek();
  REQUIRE(data);
  REQUIRE(n == 50);
  CHECK(data[0] == 'd');
  p.b->recv_consume(50);
}

TEST_CASE("ib link: a peer's bad key is reported naming the device, the peer and the status",
          "[ib][link]") {
  LinkConfig cfg{4096, 2, 0, 1 << 20};
  Pair p(cfg);
  SlotsAddr wrong{0x1000, 999};
  p.a->set_remote(wrong);
  std::vector<char> out(100, 'z');
  p.a->post_send(out.data(), out.size());
  auto r = p.a->progress();
  if (r.is_ok()) r = p.a->progress();
  REQUIRE_FALSE(r.is_ok());
  CHECK_THAT(r.status().message(), Catch::Contains("emu0:1 (emulated)") &&
                                       Catch::Contains("rank 1 (test)") &&
                                       Catch::Contains("remote access error"));
}

TEST_CASE("ib link: a dead peer process is named", "[ib][link]") {
  // Reaped, or a zombie its parent has not reaped yet (kill(pid, 0) alone reads that as alive).
  const bool reaped = GENERATE(true, false);
  INFO((reaped ? "reaped" : "a zombie"));
  auto na = emu_nic();
  LinkConfig cfg{4096, 2, 0, 1 << 20};
  QpAddr qa;
  SlotsAddr sa;
  auto la = IbLink::create(1, "rank 1 (child)", na, na.get(), cfg, &qa, &sa);
  REQUIRE(la.is_ok());
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  pid_t child = fork();
  if (child == 0) {  // the peer: a Nic and a queue pair of its own; set up, then it dies
    auto nb = emu_nic();
    QpAddr qb;
    int qp = *nb->create_qp(4, &qb);
    (void)qp;
    std::string s = qb.encode();
    (void)!write(up[1], s.c_str(), s.size());
    char c;
    (void)!read(down[0], &c, 1);  // the parent has connected
    nb->unlink_names();
    (void)!write(up[1], "k", 1);
    pause();
    _exit(0);
  }
  char buf[200] = {};
  REQUIRE(read(up[0], buf, sizeof buf - 1) > 0);
  auto qb = QpAddr::decode(buf);
  REQUIRE(qb.is_ok());
  REQUIRE(na->connect_qp((*la)->qp(), *qb).is_ok());
  REQUIRE(write(down[1], "c", 1) == 1);
  REQUIRE(read(up[0], buf, 1) == 1);
  for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
  CHECK((*la)->check_alive().is_ok());
  kill(child, SIGKILL);
  if (reaped) waitpid(child, nullptr, 0);
  // A zombie is seen at the link's next full look at the process (at most 100 ms apart).
  auto s = (*la)->check_alive();
  for (int i = 0; i < 40 && s.is_ok(); ++i) {
    usleep(50000);
    s = (*la)->check_alive();
  }
  if (!reaped) waitpid(child, nullptr, 0);
  REQUIRE_FALSE(s.is_ok());
  CHECK_THAT(s.message(), Catch::Contains("rank 1 (child)") && Catch::Contains("is gone"));
  // Its names are gone with it only once unlinked: do it as the transport does after set-up.
  na->unlink_names();
}
