// Every CHORUS_* variable is parsed strictly: a bad value is an error naming the variable and the
// value, never a silent default. Each case runs in a process of its own (some knobs are read once).
// A scan of the sources makes sure no variable is added without a case here.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

enum class Entry { kInitAll, kInitFromEnv, kUniqueId, kShrinkAgree };

struct BadValue {
  const char* var;
  const char* value;
  Entry entry = Entry::kInitAll;
  const char* also = nullptr;  // another variable the case needs, "NAME=value"
};

const BadValue kBad[] = {
    {"CHORUS_TIMEOUT", "abc"},
    {"CHORUS_TIMEOUT", "nan"},
    {"CHORUS_TIMEOUT", "inf"},
    {"CHORUS_TIMEOUT", "-1"},
    {"CHORUS_TIMEOUT", "0"},
    {"CHORUS_TIMEOUT", "5s", Entry::kInitFromEnv},
    {"CHORUS_SPIN_US", "fast"},
    {"CHORUS_SPIN_US", "-3"},
    {"CHORUS_SPIN_US", "99999999999999999999"},
    {"CHORUS_TEST_JITTER_US", "2000000"},
    {"CHORUS_TEST_WATCH_DELAY_MS", "-5"},
    {"CHORUS_TEST_WATCH_GAP_MS", "20000"},
    {"CHORUS_TEST_DEATH_NEWS_LATE_MS", "late"},
    {"CHORUS_TEST_WATCH_HOLD_MS", "soon"},
    {"CHORUS_TEST_FAILOVER_LATE_MS", "10001"},
    {"CHORUS_TEST_AWAIT_STORE_LAG_MS", "1s"},
    {"CHORUS_TEST_STORE_ADMIT_PAUSE_MS", "-1"},
    {"CHORUS_TEST_LINK_DIAL_DELAY_MS", "10001"},
    {"CHORUS_ALLOW_SHARED_GPU", "yes"},
    {"CHORUS_TEST_GPU_UUID", "two words"},
    {"CHORUS_NSOCKS", "0"},
    {"CHORUS_SOCKET_STRIPE_BYTES", "1K"},
    {"CHORUS_SHM_SLOT_BYTES", "12Q"},
    {"CHORUS_SHM_SLOTS", "1"},
    {"CHORUS_ALGO", "butterfly"},
    {"CHORUS_CHUNK_BYTES", "2G"},
    {"CHORUS_NCHANNELS", "9"},
    {"CHORUS_ALPHA_US", "-2"},
    {"CHORUS_BETA_GBPS", "0"},
    {"CHORUS_CPU_ISA", "avx9"},
    {"CHORUS_DETERMINISTIC", "2"},
    {"CHORUS_DETERMINISTIC", "yes"},
    {"CHORUS_DETERMINISTIC", "-1"},
    {"CHORUS_DETERMINISTIC", "on", Entry::kInitFromEnv},
    {"CHORUS_DEBUG", "LOUD"},
    {"CHORUS_TRANSPORT", "pigeon"},
    {"CHORUS_IB_HCA", "mlx5_0:0"},
    {"CHORUS_IB_HCA", "^"},
    {"CHORUS_IB_GID_INDEX", "300"},
    {"CHORUS_IB_SLOT_BYTES", "1K"},
    {"CHORUS_IB_SLOTS", "1"},
    {"CHORUS_IB_ZERO_COPY_BYTES", "-1"},
    {"CHORUS_IB_REG_CACHE_BYTES", "lots"},
    {"CHORUS_IB_EMULATE", "emu0:0"},
    {"CHORUS_TEST_IB_BAD_RKEY", "2"},
    {"CHORUS_TEST_SHRINK_DIE", "1:later", Entry::kShrinkAgree},
    {"CHORUS_TEST_SHRINK_DIE", "one:view", Entry::kShrinkAgree},
    {"CHORUS_SOCKET_IFNAME", "no-such-if0", Entry::kInitAll, "CHORUS_TRANSPORT=tcp"},
    {"CHORUS_STORE_BIND", "not-an-address", Entry::kUniqueId},
    {"CHORUS_STORE_HOST", "rank1", Entry::kInitFromEnv},
    {"CHORUS_STORE_FAILOVER", "yes"},
    {"CHORUS_STORE_FAILOVER", "2"},
    {"CHORUS_TEST_FAILOVER_DIE", "-2"},
    {"CHORUS_TEST_FAILOVER_DIE", "rank1"},
    {"CHORUS_TEST_SHARED_MAP_FAIL", "yes"},
    {"CHORUS_TUNE_MEASURE", "yes"},
    {"CHORUS_TUNE_MEASURE", "2"},
    {"CHORUS_TEST_SLOW_ALGO", "tree"},
    {"CHORUS_TEST_DEVICE_DIE", "rank1"},
    {"CHORUS_TEST_DEVICE_DIE", "-2"},
    {"CHORUS_TEST_REPLAY_LAG_MS", "slow"},
    {"CHORUS_TEST_REPLAY_LAG_MS", "10001"},
    {"CHORUS_TEST_HOST_PART_LINGER_MS", "long"},
    {"CHORUS_TEST_HOST_PART_LINGER_MS", "10001"},
    {"CHORUS_TEST_ALIVE_CHECK_LAG_MS", "soon"},
    {"CHORUS_TEST_ALIVE_CHECK_LAG_MS", "10001"},
    {"CHORUS_DEVICE_TIMING", "all"},
    {"CHORUS_DEVICE_TIMING", "10001"},
    {"CHORUS_STAGED_MAX_BYTES", "lots"},
    {"CHORUS_STAGED_MAX_BYTES", "-1"},
    {"CHORUS_STAGE_WORDS", "hostmem"},
    {"CHORUS_IPC_WORDS", "hostmem"},
    {"CHORUS_TEST_SHM_DIE", "rank2"},
    {"CHORUS_TEST_SHM_DIE", "-2"},
};

// Variables whose every value means something, and why.
const std::set<std::string> kFreeText = {
    "CHORUS_JOB_SECRET",      // 32 hex digits, or any other text hashed as a passphrase (README)
    "CHORUS_HOSTID",          // any text names the host
    "CHORUS_RESTART_COUNT",   // set by chorus-run; examples/train_cnn refuses a non-number
    "CHORUS_ELASTIC_DIR",     // a directory chorus-run makes (any path; tests/ddp/test_elastic.py)
    "CHORUS_ELASTIC_REJOIN",  // set by chorus-run; train_cnn refuses a non-count (test_elastic.py)
    "CHORUS_ALLOW_TF32",  // read at cuda dispatch, not by a communicator: ddp_device refuses "yes"
    // read by chorus-run alone, which refuses a bad value naming it (tests/launch/test_elastic.sh)
    "CHORUS_TEST_RUN_REAP_DELAY_MS",
};

int call(Entry entry) {
  chorusResult_t r = chorusSuccess;
  if (entry == Entry::kInitAll) {
    chorusComm_t comms[2] = {};
    r = chorusCommInitAll(comms, 2, nullptr);
    if (r == chorusSuccess)
      for (auto c : comms) chorusCommDestroy(c);
  } else if (entry == Entry::kInitFromEnv) {
    chorusComm_t comm = nullptr;
    r = chorusCommInitFromEnv(&comm);
    if (r == chorusSuccess) chorusCommDestroy(comm);
  } else if (entry == Entry::kShrinkAgree) {  // read when the survivors agree
    chorusComm_t comm = nullptr, small = nullptr;
    r = chorusCommInitAll(&comm, 1, nullptr);
    if (r == chorusSuccess) {
      r = chorusCommShrink(comm, nullptr, 0, &small, nullptr, CHORUS_SHRINK_AGREE);
      if (small) chorusCommDestroy(small);
      if (r != chorusSuccess) std::fprintf(stderr, "error: %s\n", chorusGetLastError(nullptr));
      chorusCommDestroy(comm);
      return r == chorusSuccess ? 0 : 3;
    }
  } else {
    chorusUniqueId id;
    r = chorusGetUniqueId(&id);
  }
  if (r == chorusSuccess) {
    std::fprintf(stderr, "accepted\n");
    return 0;
  }
  std::fprintf(stderr, "error: %s\n", chorusGetLastError(nullptr));
  return 3;
}

}  // namespace

TEST_CASE("a bad value of any CHORUS_* variable is an error naming the variable and the value",
          "[env]") {
  for (const BadValue& b : kBad) {
    RunOptions opt;
    opt.limit_seconds = 30;
    opt.env[b.var] = b.value;
    if (b.also) {
      std::string kv = b.also;
      opt.env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    }
    auto res = run_ranks(
        1, [&](int) { return call(b.entry); }, opt);
    INFO(b.var << "=" << b.value << " -> exit " << res[0].exit_code << ": " << res[0].output);
    CHECK(res[0].exit_code == 3);
    CHECK(contains(res[0].output, b.var));
    CHECK(contains(res[0].output, b.value));
  }
}

TEST_CASE("the same calls succeed without the bad values (the cases above test the values)",
          "[env]") {
  for (Entry e : {Entry::kInitAll, Entry::kInitFromEnv, Entry::kUniqueId, Entry::kShrinkAgree}) {
    auto res = run_ranks(
        1, [&](int) { return call(e); }, RunOptions{});
    INFO(res[0].output);
    CHECK(res[0].exit_code == 0);
  }
}

TEST_CASE("every CHORUS_* variable the sources read has a bad-value case or a reason", "[env]") {
  namespace fs = std::filesystem;
  const fs::path root = CHORUS_SOURCE_ROOT;
  std::set<std::string> tested;
  for (const BadValue& b : kBad) tested.insert(b.var);
  const std::regex name("\"(CHORUS_[A-Z0-9_]+)\"");
  int files = 0;
  for (const char* dir :
       {"common", "kernels", "transport", "collectives", "ddp", "tools", "examples"}) {
    REQUIRE(fs::is_directory(root / dir));
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".cu") continue;
      ++files;
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      for (std::sregex_iterator m(s.begin(), s.end(), name), end; m != end; ++m) {
        const std::string var = (*m)[1];
        INFO(e.path().string() << " reads " << var);
        CHECK((tested.count(var) || kFreeText.count(var)));
      }
    }
  }
  REQUIRE(files > 50);
}

TEST_CASE("ranks that disagree on CHORUS_DETERMINISTIC all fail creation, naming both ranks",
          "[env][deterministic]") {
  // Rank 1 asks for the mode, ranks 0 and 2 do not: every rank must fail at once, not hang.
  RunOptions opt;
  opt.limit_seconds = 30;
  auto res = run_ranks(
      3,
      [](int rank) {
        if (rank == 1)
          setenv("CHORUS_DETERMINISTIC", "1", 1);
        else
          unsetenv("CHORUS_DETERMINISTIC");
        chorusComm_t comm = nullptr;
        const chorusResult_t r = chorusCommInitFromEnv(&comm);
        if (r == chorusSuccess) {
          chorusCommDestroy(comm);
          std::fprintf(stderr, "accepted\n");
          return 1;
        }
        std::fprintf(stderr, "error %d: %s\n", r, chorusGetLastError(nullptr));
        return r == chorusInvalidUsage ? 0 : 2;
      },
      opt);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << " output: " << res[r].output);
    CHECK(res[r].exit_code == 0);
    CHECK(res[r].seconds < 20);
    CHECK(contains(res[r].output, "CHORUS_DETERMINISTIC"));
    // Two ranks that differ, each with its real setting: this rank's own finding, or the news
    // of another rank's failure (whichever comes first).
    const std::regex pair(
        "the deterministic mode is (on|off) on rank (\\d) but (on|off) on rank (\\d)");
    std::smatch m;
    REQUIRE(std::regex_search(res[r].output, m, pair));
    CHECK(m[1] != m[3]);
    CHECK(m[1] == (m[2] == "1" ? "on" : "off"));
    CHECK(m[3] == (m[4] == "1" ? "on" : "off"));
  }
}

namespace {

// Creates a 2-rank communicator in two threads of this process, rank k with configs[k];
// returns each rank's result and last error message.
struct InitResult {
  chorusResult_t code;
  std::string message;
};
std::vector<InitResult> init_two(const chorusConfig_t configs[2]) {
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) return {};
  std::vector<InitResult> out(2);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      chorusComm_t comm = nullptr;
      out[k].code = chorusCommInitRankConfig(&comm, 2, id, k, &configs[k]);
      out[k].message = out[k].code == chorusSuccess ? "" : chorusGetLastError(nullptr);
      if (comm) chorusCommDestroy(comm);
    });
  for (auto& t : threads) t.join();
  std::fprintf(stderr, "rank 0: %d %s\nrank 1: %d %s\n", out[0].code, out[0].message.c_str(),
               out[1].code, out[1].message.c_str());
  return out;
}

bool both(const std::vector<InitResult>& r, chorusResult_t code, const std::string& part) {
  return r.size() == 2 && r[0].code == code && r[1].code == code && contains(r[0].message, part) &&
         contains(r[1].message, part);
}

// Both ranks refused creation, each naming its own mode and the other rank's.
bool disagree(const std::vector<InitResult>& r, const std::string& mode0,
              const std::string& mode1) {
  return both(r, chorusInvalidUsage, "the deterministic mode is") &&
         contains(r[0].message, mode0 + " on rank 0 but " + mode1 + " on rank 1") &&
         contains(r[1].message, mode1 + " on rank 1 but " + mode0 + " on rank 0");
}

}  // namespace

TEST_CASE(
    "config.deterministic: 2 is refused; a config of the first size is accepted and "
    "follows CHORUS_DETERMINISTIC; the config wins over the variable",
    "[env][deterministic][config]") {
  RunOptions opt;
  opt.limit_seconds = 60;
  opt.env["CHORUS_DETERMINISTIC"] = "1";
  auto res = run_ranks(
      1,
      [](int) {
        chorusConfig_t c[2] = {CHORUS_CONFIG_INITIALIZER, CHORUS_CONFIG_INITIALIZER};
        c[0].deterministic = c[1].deterministic = 2;
        if (!both(init_two(c), chorusInvalidArgument,
                  "config->deterministic is 2, expected 1 (on), 0 (off) or -1"))
          return 10;
        c[0].deterministic = c[1].deterministic = -2;
        if (!both(init_two(c), chorusInvalidArgument, "config->deterministic is -2")) return 11;
        // The first version of the struct ended before `deterministic`: rank 0's config is of
        // that size (and its field holds garbage it must not read), so CHORUS_DETERMINISTIC=1
        // decides for it, which agrees with rank 1's explicit 1...
        c[0] = c[1] = CHORUS_CONFIG_INITIALIZER;
        c[0].size = offsetof(chorusConfig_t, deterministic);
        c[0].deterministic = 7;
        c[1].deterministic = 1;
        if (!both(init_two(c), chorusSuccess, "")) return 12;
        // ... and disagrees with an explicit 0, which wins over the variable.
        c[1].deterministic = 0;
        if (!disagree(init_two(c), "on", "off")) return 13;
        // -1 leaves it to the variable: the same as the old size.
        c[0] = c[1] = CHORUS_CONFIG_INITIALIZER;
        c[1].deterministic = 1;
        if (!both(init_two(c), chorusSuccess, "")) return 14;
        c[0].deterministic = 0;
        if (!disagree(init_two(c), "off", "on")) return 15;
        return 0;
      },
      opt);
  INFO(res[0].output);
  CHECK(res[0].exit_code == 0);
}
