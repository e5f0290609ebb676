// The C ABI's exception boundary: no C++ exception leaves a chorus* function. This binary
// replaces operator new so that the k-th allocation made by the calling thread throws
// std::bad_alloc; each entry point is called with k = 1, 2, ... until it makes fewer than k
// allocations, so every allocation it makes fails once. Each time the call must return an
// error code (never throw, never crash) whose message names it, and a peer waiting in the
// same collective must fail at once rather than wait for its timeout.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"

namespace {

thread_local long t_fail_at = 0;  // 0: never; n: the n-th allocation from arming on throws
thread_local long t_count = 0;

bool inject() {
  return t_fail_at > 0 && ++t_count == t_fail_at;
}

}  // namespace

void* operator new(std::size_t n) {
  if (inject()) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return ::operator new(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return inject() ? nullptr : std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return ::operator new(n, t);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using Fn = std::function<chorusResult_t(chorusComm_t)>;

// An entry point called on rank 0 with injection armed, and what rank 1 does meanwhile.
struct Case {
  std::string name;
  Fn mine;
  Fn partner;
};

float g_a[2][64], g_b[2][256];
// All-to-all-v over two ranks: 32 elements each way, rank r's block to itself first.
const size_t g_counts[2] = {32, 32}, g_displs[2] = {0, 32};

Fn all_reduce(int r) {
  return [r](chorusComm_t c) {
    return chorusAllReduce(g_a[r], g_b[r], 64, chorusFloat32, chorusSum, c, nullptr);
  };
}
Fn waited(std::function<chorusResult_t(chorusComm_t, chorusRequest_t*)> start) {
  return [start](chorusComm_t c) {
    chorusRequest_t req = nullptr;
    chorusResult_t rc = start(c, &req);
    if (rc != chorusSuccess) return rc;
    t_fail_at = 0;  // the wait is not under test here
    rc = chorusWait(req, -1);
    chorusRequestFree(req);
    return rc;
  };
}

std::vector<Case> cases() {
  auto a = [](int r) { return g_a[r]; };
  auto b = [](int r) { return g_b[r]; };
  std::vector<Case> out;
  auto both = [&](std::string name, std::function<Fn(int)> f) {
    out.push_back({std::move(name), f(0), f(1)});
  };
  both("chorusAllReduce", all_reduce);
  both("chorusBroadcast", [&](int r) {
    return Fn([=](chorusComm_t c) {
      return chorusBroadcast(a(r), b(r), 64, chorusFloat32, 0, c, nullptr);
    });
  });
  both("chorusReduce", [&](int r) {
    return Fn([=](chorusComm_t c) {
      return chorusReduce(a(r), b(r), 64, chorusFloat32, chorusMax, 1, c, nullptr);
    });
  });
  both("chorusAllGather", [&](int r) {
    return Fn(
        [=](chorusComm_t c) { return chorusAllGather(a(r), b(r), 64, chorusFloat32, c, nullptr); });
  });
  both("chorusReduceScatter", [&](int r) {
    return Fn([=](chorusComm_t c) {
      return chorusReduceScatter(a(r), b(r), 32, chorusFloat32, chorusSum, c, nullptr);
    });
  });
  both("chorusGather", [&](int r) {
    return Fn(
        [=](chorusComm_t c) { return chorusGather(a(r), b(r), 64, chorusFloat32, 1, c, nullptr); });
  });
  both("chorusScatter", [&](int r) {
    return Fn([=](chorusComm_t c) {
      return chorusScatter(a(r), b(r), 32, chorusFloat32, 0, c, nullptr);
    });
  });
  both("chorusAllToAll", [&](int r) {
    return Fn(
        [=](chorusComm_t c) { return chorusAllToAll(a(r), b(r), 32, chorusFloat32, c, nullptr); });
  });
  both("chorusAllToAll in place", [&](int r) {
    return Fn(
        [=](chorusComm_t c) { return chorusAllToAll(b(r), b(r), 32, chorusFloat32, c, nullptr); });
  });
  both("chorusAllToAllv", [&](int r) {
    return Fn([=](chorusComm_t c) {
      return chorusAllToAllv(a(r), g_counts, g_displs, b(r), g_counts, g_displs, chorusFloat32, c,
                             nullptr);
    });
  });
  both("chorusBarrier",
       [&](int) { return Fn([](chorusComm_t c) { return chorusBarrier(c, nullptr); }); });
  out.push_back(
      {"chorusSend",
       [&](chorusComm_t c) { return chorusSend(a(0), 64, chorusFloat32, 1, c, nullptr); },
       [&](chorusComm_t c) { return chorusRecv(b(1), 64, chorusFloat32, 0, c, nullptr); }});
  out.push_back(
      {"chorusRecv",
       [&](chorusComm_t c) { return chorusRecv(b(0), 64, chorusFloat32, 1, c, nullptr); },
       [&](chorusComm_t c) { return chorusSend(a(1), 64, chorusFloat32, 0, c, nullptr); }});
  both("chorusIallReduce", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIallReduce(a(r), b(r), 64, chorusFloat32, chorusSum, c, q);
    });
  });
  both("chorusIbroadcast", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIbroadcast(a(r), b(r), 64, chorusFloat32, 1, c, q);
    });
  });
  both("chorusIreduce", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIreduce(a(r), b(r), 64, chorusFloat32, chorusSum, 0, c, q);
    });
  });
  both("chorusIallGather", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIallGather(a(r), b(r), 64, chorusFloat32, c, q);
    });
  });
  both("chorusIreduceScatter", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIreduceScatter(a(r), b(r), 32, chorusFloat32, chorusSum, c, q);
    });
  });
  both("chorusIgather", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIgather(a(r), b(r), 64, chorusFloat32, 0, c, q);
    });
  });
  both("chorusIscatter", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIscatter(a(r), b(r), 32, chorusFloat32, 1, c, q);
    });
  });
  both("chorusIallToAll", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIallToAll(a(r), b(r), 32, chorusFloat32, c, q);
    });
  });
  both("chorusIallToAllv", [&](int r) {
    return waited([=](chorusComm_t c, chorusRequest_t* q) {
      return chorusIallToAllv(a(r), g_counts, g_displs, b(r), g_counts, g_displs, chorusFloat32, c,
                              q);
    });
  });
  both("chorusIbarrier", [&](int) {
    return waited([](chorusComm_t c, chorusRequest_t* q) { return chorusIbarrier(c, q); });
  });
  out.push_back(
      {"chorusIsend", waited([&](chorusComm_t c, chorusRequest_t* q) {
         return chorusIsend(a(0), 64, chorusFloat32, 1, 0, c, q);
       }),
       [&](chorusComm_t c) { return chorusRecv(b(1), 64, chorusFloat32, 0, c, nullptr); }});
  out.push_back(
      {"chorusIrecv", waited([&](chorusComm_t c, chorusRequest_t* q) {
         return chorusIrecv(b(0), 64, chorusFloat32, 1, 0, c, q);
       }),
       [&](chorusComm_t c) { return chorusSend(a(1), 64, chorusFloat32, 0, c, nullptr); }});
  auto grouped = [&](int r) {
    return Fn([=](chorusComm_t c) {
      chorusGroupStart();
      chorusSend(a(r), 64, chorusFloat32, 1 - r, c, nullptr);
      chorusRecv(b(r), 64, chorusFloat32, 1 - r, c, nullptr);
      return chorusGroupEnd();
    });
  };
  both("chorusGroupEnd", grouped);
  return out;
}

struct Pair {
  chorusComm_t c[2] = {nullptr, nullptr};
  Pair() { REQUIRE(chorusCommInitAll(c, 2, nullptr) == chorusSuccess); }
  ~Pair() {
    for (chorusComm_t x : c) chorusCommDestroy(x);
  }
};

// Runs f with the k-th allocation of this thread failing. hit: that allocation was reached.
chorusResult_t armed(long k, const std::function<chorusResult_t()>& f, bool* hit, bool* escaped) {
  t_count = 0;
  t_fail_at = k;
  chorusResult_t rc = chorusInternalError;
  try {
    rc = f();
  } catch (...) {
    *escaped = true;
  }
  *hit = t_count >= k;
  t_fail_at = 0;
  return rc;
}

}  // namespace

TEST_CASE("no exception leaves an operation call; the peer fails at once", "[c_api][exceptions]") {
  setenv("CHORUS_TIMEOUT", "20", 1);
  long all_points = 0;
  for (const Case& cs : cases()) {
    long points = 0;
    for (long k = 1;; ++k) {
      Pair p;
      chorusResult_t partner_rc = chorusSuccess;
      double partner_took = 0;
      std::thread partner([&] {
        const double t0 = now();
        partner_rc = cs.partner(p.c[1]);
        partner_took = now() - t0;
      });
      bool hit = false, escaped = false;
      const chorusResult_t rc = armed(
          k, [&] { return cs.mine(p.c[0]); }, &hit, &escaped);
      const std::string msg = chorusGetLastError(nullptr);
      partner.join();
      INFO(cs.name << ": allocation " << k << " failed; returned " << rc << " \"" << msg
                   << "\"; peer returned " << partner_rc << " after " << partner_took << " s");
      REQUIRE_FALSE(escaped);
      if (!hit) {
        REQUIRE(rc == chorusSuccess);
        break;
      }
      ++points;
      if (rc != chorusSuccess) {
        CHECK((rc == chorusSystemError || rc == chorusAborted || rc == chorusRemoteError));
        CHECK_THAT(msg, Catch::Contains(cs.name) || Catch::Contains("out of memory"));
      }
      CHECK(partner_took < 10);  // not its 20 s timeout
    }
    // A blocking call that runs inline allocates nothing on its way (c_api_ops.cc, submit): no
    // allocation of it can fail. The asynchronous forms (a request) and the calls that stage
    // allocate, so the injection is shown to work below.
    if (points == 0) std::printf("%s: allocates nothing\n", cs.name.c_str());
    all_points += points;
  }
  CHECK(all_points > 0);
}

// Calls on a one-rank communicator (nothing to wait for) or none: only the boundary is checked.
// chorusCommDestroy is not armed: ~WatchClient (transport/store.cc) sends a message, and an
// allocation failing there ends in std::terminate from a destructor -- teardown hardening
// (issue 18 item 4) owns that path.
TEST_CASE("no exception leaves communicator set-up, split and abort", "[c_api][exceptions]") {
  setenv("CHORUS_TIMEOUT", "20", 1);
  struct Solo {
    std::string name;
    bool needs_comm;
    std::function<chorusResult_t(chorusComm_t*)> call;  // a fresh one-rank communicator, if needed
  };
  const std::vector<Solo> solos = {
      // Three ranks: a thread that cannot be started after others were must stop those too.
      {"chorusCommInitAll", false,
       [](chorusComm_t*) {
         chorusComm_t three[3] = {};
         const chorusResult_t rc = chorusCommInitAll(three, 3, nullptr);
         t_fail_at = 0;
         if (rc == chorusSuccess)
           for (chorusComm_t x : three) chorusCommDestroy(x);
         return rc;
       }},
      {"chorusGetUniqueId", false,
       [](chorusComm_t*) {
         chorusUniqueId id;
         return chorusGetUniqueId(&id);
       }},
      {"chorusCommSplit", true,
       [](chorusComm_t* c) {
         chorusComm_t sub = nullptr;
         const chorusResult_t rc = chorusCommSplit(*c, 0, 0, &sub);
         t_fail_at = 0;
         if (sub) chorusCommDestroy(sub);
         return rc;
       }},
      {"chorusCommAbort", true, [](chorusComm_t* c) { return chorusCommAbort(*c); }},
      {"chorusCommRevoke", true, [](chorusComm_t* c) { return chorusCommRevoke(*c); }},
  };
  for (const Solo& solo : solos) {
    long points = 0;
    for (long k = 1;; ++k) {
      chorusComm_t c = nullptr;
      if (solo.needs_comm) REQUIRE(chorusCommInitAll(&c, 1, nullptr) == chorusSuccess);
      bool hit = false, escaped = false;
      const chorusResult_t rc = armed(
          k, [&] { return solo.call(&c); }, &hit, &escaped);
      const std::string msg = chorusGetLastError(nullptr);
      INFO(solo.name << ": allocation " << k << " failed; returned " << rc << " \"" << msg << "\"");
      REQUIRE_FALSE(escaped);
      if (c) chorusCommDestroy(c);
      if (!hit) {
        REQUIRE(rc == chorusSuccess);
        break;
      }
      ++points;
      if (rc != chorusSuccess) CHECK_THAT(msg, Catch::Contains("chorus"));
    }
    INFO(solo.name);
    CHECK(points > 0);
  }
}
