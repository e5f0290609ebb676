// Transport units: knob parsing, secrets, Slurm host lists, the bootstrap store's bounds.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "common/env.h"
#include "common/socket.h"
#include "transport/rendezvous.h"
#include "transport/shm.h"
#include "transport/store.h"
#include "transport/wire.h"

using namespace chorus;
using namespace chorus::transport;

TEST_CASE("sizes take K/M/G suffixes and reject junk", "[env]") {
  REQUIRE(parse_size("17") == 17);
  REQUIRE(parse_size("512K") == 512 * 1024);
  REQUIRE(parse_size("4M") == 4 << 20);
  REQUIRE(parse_size("2G") == int64_t{2} << 30);
  REQUIRE_FALSE(parse_size("12Q").has_value());
  REQUIRE_FALSE(parse_size("").has_value());
  setenv("CHORUS_TEST_KNOB", "banana", 1);
  auto r = env_int("CHORUS_TEST_KNOB", 1);
  REQUIRE_FALSE(r.is_ok());
  REQUIRE(r.status().message().find("CHORUS_TEST_KNOB='banana'") != std::string::npos);
}

TEST_CASE("secrets round-trip through hex and differ per job id", "[wire]") {
  Secret a = secret_from_string("job-1"), b = secret_from_string("job-2"), c{};
  REQUIRE(a != b);
  REQUIRE(parse_secret_hex(secret_hex(a), &c));
  REQUIRE(a == c);
  REQUIRE_FALSE(parse_secret_hex("xyz", &c));
}

TEST_CASE("the first host of a Slurm node list", "[rendezvous]") {
  REQUIRE(slurm_first_host("node[01-04,07],gpu5") == "node01");
  REQUIRE(slurm_first_host("alpha,beta") == "alpha");
  REQUIRE(slurm_first_host("single") == "single");
}

TEST_CASE("the store serves set/get, times out gets, and refuses oversized requests", "[store]") {
  Secret secret = secret_from_string("store-test");
  auto server = StoreServer::start("127.0.0.1", 0, secret, 1);
  REQUIRE(server.is_ok());
  SockAddr addr = server.value()->address();
  auto client = StoreClient::connect(addr, secret, 0, 1, Deadline::after_seconds(5));
  REQUIRE(client.is_ok());
  REQUIRE(client.value()->set("k", "v").is_ok());
  auto got = client.value()->get("k", Deadline::after_seconds(1));
  REQUIRE(got.is_ok());
  REQUIRE(got.value() == "v");
  auto missing = client.value()->get("nope", Deadline::after_seconds(0.2));
  REQUIRE(missing.status().code() == Code::kTimeout);

  // A client that passed the handshake but asks for a 1 GiB value is answered and cut off.
  auto raw = tcp_connect(addr, Deadline::after_seconds(2));
  REQUIRE(raw.is_ok());
  Hello h;
  h.kind = static_cast<uint16_t>(ConnKind::kStore);
  h.secret = secret;
  h.rank = 0;
  h.world = 1;
  REQUIRE(client_handshake(raw->get(), h, "store", Deadline::after_seconds(2)).is_ok());
  struct { uint32_t op, key_len; uint64_t val_len; uint32_t timeout_ms, reserved; } req{1, 1, uint64_t{1} << 30, 0, 0};
  REQUIRE(send_all(raw->get(), &req, sizeof req, Deadline::after_seconds(2), "store").is_ok());
  struct { int32_t code; uint32_t reserved; uint64_t len; } resp{};
  REQUIRE(recv_all(raw->get(), &resp, sizeof resp, Deadline::after_seconds(2), "store").is_ok());
  REQUIRE(resp.code == static_cast<int32_t>(Code::kInvalidArgument));
  std::string text(resp.len, '\0');
  REQUIRE(recv_all(raw->get(), text.data(), text.size(), Deadline::after_seconds(2), "store").is_ok());
  REQUIRE(text.find("exceeds the limits") != std::string::npos);
  char byte;
  REQUIRE_FALSE(recv_all(raw->get(), &byte, 1, Deadline::after_seconds(2), "store").is_ok());  // closed
  // The good client is unaffected.
  REQUIRE(client.value()->get("k", Deadline::after_seconds(1)).is_ok());
}

TEST_CASE("a wrong secret is refused with a reason", "[store][wire]") {
  auto server = StoreServer::start("127.0.0.1", 0, secret_from_string("a"), 1);
  REQUIRE(server.is_ok());
  auto c = StoreClient::connect(server.value()->address(), secret_from_string("b"), 0, 1, Deadline::after_seconds(3));
  REQUIRE_FALSE(c.is_ok());
  REQUIRE(c.status().message().find("wrong job secret") != std::string::npos);
}

TEST_CASE("a /dev/shm too small for the rings is a clear error", "[shm]") {
  ShmConfig cfg;
  cfg.slot_bytes = size_t{32} << 20;  // 32 MiB slots x 100,000: terabytes
  cfg.nslots = 100000;
  auto seg = ShmSegment::create("/chorus-test-too-big-" + std::to_string(getpid()), 1, cfg);
  REQUIRE_FALSE(seg.is_ok());
  INFO(seg.status().message());
  REQUIRE(seg.status().message().find("/dev/shm is too small") != std::string::npos);
}

// Found by fuzz/handshake: the verdict's code came from the peer unchecked.
TEST_CASE("a refusal with a code chorus does not define is a remote error naming the code",
          "[wire][fuzz]") {
  for (int32_t code : {10, 1, -3, 999}) {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    Verdict v;
    v.code = code;
    v.text_len = 2;
    REQUIRE(send_all(fds[1], &v, sizeof v, Deadline::after_seconds(2), "test").is_ok());
    REQUIRE(send_all(fds[1], "no", 2, Deadline::after_seconds(2), "test").is_ok());
    Hello h = make_hello(ConnKind::kStore, secret_from_string("x"), 0, 1);
    Status s = client_handshake(fds[0], h, "the server", Deadline::after_seconds(2));
    CHECK(s.code() == Code::kRemoteError);
    CHECK(s.message() == fmt::format("refused by the server with unknown code {}: no", code));
    close(fds[0]);
    close(fds[1]);
  }
}

namespace {
long vm_size_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
  return -1;
}
}  // namespace

// Found by TSan (thread leak at exit): the thread of each closed connection was joined only when
// the store stopped, so every connection kept its stack (8 MiB of address space) until then.
TEST_CASE("the store joins the threads of closed connections as they end", "[store]") {
  Secret secret = secret_from_string("store-threads");
  auto server = StoreServer::start("127.0.0.1", 0, secret, 1);
  REQUIRE(server.is_ok());
  SockAddr addr = server.value()->address();
  auto connect_and_close = [&] {
    auto c = StoreClient::connect(addr, secret, 0, 1, Deadline::after_seconds(5));
    REQUIRE(c.is_ok());
  };
  connect_and_close();
  usleep(300000);
  long before = vm_size_kib();
  for (int i = 0; i < 40; ++i) {
    connect_and_close();
    usleep(20000);
  }
  usleep(500000);
  long grown_mib = (vm_size_kib() - before) / 1024;
  INFO("address space grew by " << grown_mib << " MiB over 40 closed connections");
  CHECK(grown_mib < 100);  // 40 stacks kept would be 320 MiB
}
