// The bootstrap store against authenticated but careless or hostile peers: unbounded data,
// too many connections, a storm of broadcasts while new watch clients connect, answers nobody
// asked for; and the order error news goes out in. 127.0.0.1 only.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "probes.h"
#include "transport/store.h"
#include "transport/wire.h"

using namespace chorus;
using namespace chorus::transport;

namespace {

Result<Fd> raw_watch(const SockAddr& at, const Secret& secret, int rank, int world) {
  return dial(at, secret, make_hello(ConnKind::kWatch, rank, world), "store",
              Deadline::after_seconds(5));
}

}  // namespace

TEST_CASE("authenticated peers cannot store unbounded data", "[adversarial][store]") {
  Secret secret = secret_from_string("cap");
  StoreOptions opt;
  opt.world = 2;
  opt.max_bytes = 1 << 20;
  auto server = StoreServer::start("127.0.0.1", 0, secret, opt);
  REQUIRE(server.is_ok());
  auto c =
      StoreClient::connect(server.value()->address(), secret, 1, 2, Deadline::after_seconds(5));
  REQUIRE(c.is_ok());
  std::string chunk(256 << 10, 'x');
  int accepted = 0;
  Status last;
  for (int i = 0; i < 16; ++i) {
    last = c.value()->set(fmt::format("k{}", i), chunk);
    if (!last.is_ok()) break;
    ++accepted;
  }
  INFO(last.message());
  REQUIRE(accepted == 3);  // 3 x 256 KiB fit under 1 MiB with their keys; the 4th does not
  REQUIRE(last.code() == Code::kInvalidUsage);
  REQUIRE(last.message().find("the bootstrap store is full") != std::string::npos);
  REQUIRE(server.value()->stored_bytes() <= opt.max_bytes);
  // Replacing a value counts its new size only; the store keeps serving.
  REQUIRE(c.value()->set("k0", "small").is_ok());
  REQUIRE(c.value()->set("k3", chunk).is_ok());
  REQUIRE(c.value()->get("k0", Deadline::after_seconds(1)).value() == "small");
}

TEST_CASE("authenticated connections beyond the limit are refused with a reason",
          "[adversarial][store]") {
  Secret secret = secret_from_string("conns");
  StoreOptions opt;
  opt.world = 2;
  opt.max_conns = 4;
  auto server = StoreServer::start("127.0.0.1", 0, secret, opt);
  REQUIRE(server.is_ok());
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < 4; ++i) {
    auto c =
        StoreClient::connect(server.value()->address(), secret, 1, 2, Deadline::after_seconds(5));
    REQUIRE(c.is_ok());
    clients.push_back(std::move(c.value()));
  }
  auto extra =
      StoreClient::connect(server.value()->address(), secret, 1, 2, Deadline::after_seconds(5));
  REQUIRE_FALSE(extra.is_ok());
  REQUIRE(extra.status().message().find("already serves 4 connections (limit 4)") !=
          std::string::npos);
  clients.pop_back();  // a slot frees when a connection ends
  double until = test::now_s() + 3;
  Result<std::unique_ptr<StoreClient>> again = Status(Code::kTimeout, "not tried");
  while (test::now_s() < until) {
    again =
        StoreClient::connect(server.value()->address(), secret, 1, 2, Deadline::after_seconds(5));
    if (again.is_ok()) break;
    usleep(50000);
  }
  REQUIRE(again.is_ok());
}

TEST_CASE("a new watch client never reads a broadcast as its verdict",
          "[adversarial][store][race]") {
  Secret secret = secret_from_string("verdict race");
  auto server = StoreServer::start("127.0.0.1", 0, secret, 4);
  REQUIRE(server.is_ok());
  SockAddr at = server.value()->address();
  // Rank 0 floods errors: each is broadcast to every other watch connection.
  auto noisy = raw_watch(at, secret, 0, 4);
  REQUIRE(noisy.is_ok());
  std::atomic<bool> stop{false};
  std::thread storm([&] {
    std::string frame = encode_watch(WatchType::kError, 0, 7, 0, -1, std::string(200, 'e'));
    while (!stop.load())
      if (!send_all(noisy->get(), frame.data(), frame.size(), Deadline::after_seconds(2), "store")
               .is_ok())
        break;
  });
  int failures = 0;
  std::string first_failure;
  // The window was narrow: the old store failed about 3 of 1000 of these ("bad magic 0x3").
  for (int i = 0; i < 3000; ++i) {
    auto w = raw_watch(at, secret, 1 + i % 3, 4);
    if (!w.is_ok()) {
      if (failures++ == 0) first_failure = w.status().message();
      continue;
    }
    std::string bye = encode_watch(WatchType::kBye, 1 + i % 3, 0, 0, -1, "");
    (void)send_all(w->get(), bye.data(), bye.size(), Deadline::after_seconds(2), "store");
  }
  stop = true;
  storm.join();
  INFO(first_failure);
  REQUIRE(failures == 0);
}

TEST_CASE("state answers nobody waits for are dropped, not kept", "[adversarial][store]") {
  Secret secret = secret_from_string("answers");
  auto server = StoreServer::start("127.0.0.1", 0, secret, 2);
  REQUIRE(server.is_ok());
  SockAddr at = server.value()->address();
  auto watch = WatchClient::connect(
      at, secret, 0, 2, [](const WatchEvent&) {}, [](uint64_t) { return std::string("idle"); },
      Deadline::after_seconds(5));
  REQUIRE(watch.is_ok());
  auto peer = raw_watch(at, secret, 1, 2);
  REQUIRE(peer.is_ok());
  // Rank 1 sends 500 answers (64 KiB each) to rank 0 for queries it never made.
  long rss0 = test::rss_bytes();
  for (uint64_t q = 0; q < 500; ++q) {
    std::string f = encode_watch(WatchType::kState, 1, 9, q, 0, std::string(64 << 10, 'a'));
    REQUIRE(send_all(peer->get(), f.data(), f.size(), Deadline::after_seconds(5), "store").is_ok());
  }
  // A real query still works, and afterwards nothing is held.
  std::thread answer([&] {
    // Answers the query rank 0 is about to make (qids start at rank << 40 | 1).
    usleep(200000);
    std::string f =
        encode_watch(WatchType::kState, 1, 9, uint64_t{0} << 40 | 1, 0, "in barrier #3");
    (void)send_all(peer->get(), f.data(), f.size(), Deadline::after_seconds(5), "store");
  });
  auto got = watch.value()->query(9, 1, 3.0);
  answer.join();
  long grown = test::rss_bytes() - rss0;
  if (test::sanitized_build()) {
    WARN("resident memory not checked: ASan keeps freed memory in quarantine");
  } else {
    INFO("resident memory grew by " << grown << " bytes");
    REQUIRE(grown < (8 << 20));  // before: all 32 MiB of unasked answers were kept
  }
  REQUIRE(got.size() == 1);
  REQUIRE(got[1] == "in barrier #3");
  REQUIRE(watch.value()->pending_answers() == 0);
}

TEST_CASE("frames from peers are bounded before anything is allocated", "[adversarial][store]") {
  StoreReqHeader h{kSet, 10, uint64_t{1} << 40, 0, 0};
  auto r = parse_store_request_header(&h, sizeof h);
  REQUIRE_FALSE(r.is_ok());
  REQUIRE(r.status().message().find("exceeds the limits") != std::string::npos);
  h = {99, 1, 1, 0, 0};
  REQUIRE(parse_store_request_header(&h, sizeof h).status().message() == "unknown request 99");
  WatchHeader w{static_cast<uint32_t>(WatchType::kState), 1, 0, 0, 0, 1u << 30};
  REQUIRE_FALSE(parse_watch_header(&w, sizeof w).is_ok());
  w = {77, 1, 0, 0, 0, 1};
  REQUIRE(parse_watch_header(&w, sizeof w).status().message() == "unknown watch message type 77");
  StoreRespHeader resp{0, 0, uint64_t{1} << 62};
  REQUIRE_FALSE(parse_store_response_header(&resp, sizeof resp).is_ok());
  std::string frame = encode_store_request(kSet, "key", "value", 0);
  auto whole = decode_store_request(frame.data(), frame.size());
  REQUIRE(whole.is_ok());
  REQUIRE(whole->key == "key");
  REQUIRE_FALSE(decode_store_request(frame.data(), frame.size() - 1).is_ok());
}

namespace {

// Reads one watch frame from fd; returns CLOCK_MONOTONIC seconds when it had arrived (-1: none).
double read_frame_at(int fd) {
  WatchHeader raw;
  auto d = Deadline::after_seconds(5);
  if (!recv_all(fd, &raw, sizeof raw, d, "store").is_ok()) return -1;
  auto m = parse_watch_header(&raw, sizeof raw);
  if (!m.is_ok()) return -1;
  std::string text(m->text_len, '\0');
  if (!recv_all(fd, text.data(), text.size(), d, "store").is_ok()) return -1;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace

// A rank hosting the store may end its process as soon as it hears of an error, and the store
// with it: the store forwards error news to clients in its own process last. Here the host's own
// client connects first and the forwards are spaced 300 ms apart (CHORUS_TEST_WATCH_GAP_MS), so
// in connection order the other process would hear 300 ms after the host.
TEST_CASE("error news reaches other processes before the store's own", "[adversarial][store]") {
  int to_child[2], from_child[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(from_child) == 0);
  Secret secret = secret_from_string("host last");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // another rank's process: connects once told the port, reports its arrival
    int port = 0;
    double at = -1;
    if (read(to_child[0], &port, sizeof port) == sizeof port) {
      auto w = raw_watch(SockAddr{"127.0.0.1", port}, secret, 1, 3);
      char ready = w.is_ok() ? 'y' : 'n';
      (void)!write(from_child[1], &ready, 1);
      if (w.is_ok()) at = read_frame_at(w->get());
    }
    (void)!write(from_child[1], &at, sizeof at);
    _exit(0);
  }
  setenv("CHORUS_TEST_WATCH_GAP_MS", "300", 1);
  auto server = StoreServer::start("127.0.0.1", 0, secret, 3);
  unsetenv("CHORUS_TEST_WATCH_GAP_MS");
  REQUIRE(server.is_ok());
  SockAddr at = server.value()->address();
  auto mine = raw_watch(at, secret, 0, 3);  // the host's own client, first in line
  REQUIRE(mine.is_ok());
  REQUIRE(write(to_child[1], &at.port, sizeof at.port) == sizeof at.port);
  char ready = 0;
  REQUIRE(read(from_child[0], &ready, 1) == 1);
  REQUIRE(ready == 'y');
  auto sender = raw_watch(at, secret, 2, 3);
  REQUIRE(sender.is_ok());
  std::string frame = encode_watch(WatchType::kError, 2, 7, 0, -1, "rank 2 failed");
  REQUIRE(send_all(sender->get(), frame.data(), frame.size(), Deadline::after_seconds(2), "store")
              .is_ok());
  const double host_at = read_frame_at(mine->get());
  double other_at = -1;
  REQUIRE(read(from_child[0], &other_at, sizeof other_at) == sizeof other_at);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(host_at > 0);
  REQUIRE(other_at > 0);
  INFO("the other process heard at " << other_at << ", the host at " << host_at);
  CHECK(other_at < host_at);
}

// A watch client that has its verdict hears every later broadcast, also when the store's thread
// for it is held up right after the verdict (CHORUS_TEST_STORE_ADMIT_PAUSE_MS, as a loaded machine
// may) and the store's process ends right after the news: the connection is registered before
// the verdict goes out. Registered after it, the news passed it by (1 run in 70 of a loaded
// test_failures, "the store's host ending as soon as it hears of an error").
TEST_CASE("a watch client with its verdict hears the news sent before its thread went on",
          "[adversarial][store]") {
  int to_child[2], from_child[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(from_child) == 0);
  Secret secret = secret_from_string("registered first");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the store's host: announces an error once told, and ends at once
    setenv("CHORUS_TEST_STORE_ADMIT_PAUSE_MS", "2000", 1);
    auto server = StoreServer::start("127.0.0.1", 0, secret, 2);
    int port = server.is_ok() ? server.value()->address().port : 0;
    (void)!write(from_child[1], &port, sizeof port);
    char go = 0;
    if (server.is_ok() && read(to_child[0], &go, 1) == 1)
      server.value()->announce_error(0, 7, "rank 0 failed");
    _exit(0);
  }
  int port = 0;
  REQUIRE(read(from_child[0], &port, sizeof port) == sizeof port);
  REQUIRE(port > 0);
  auto w = raw_watch(SockAddr{"127.0.0.1", port}, secret, 1, 2);  // has its verdict
  REQUIRE(w.is_ok());
  REQUIRE(write(to_child[1], "g", 1) == 1);
  const double heard = read_frame_at(w->get());
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(heard > 0);
}
