// Every CHORUS_* variable is parsed strictly: a bad value is an error naming the variable and the
// value, never a silent default. Each case runs in a process of its own (some knobs are read once).
// A scan of the sources makes sure no variable is added without a case here.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "chorus/chorus.h"
#include "harness.h"

using chorus::test::contains;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

enum class Entry { kInitAll, kInitFromEnv, kUniqueId };

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
    {"CHORUS_DEBUG", "LOUD"},
    {"CHORUS_TRANSPORT", "pigeon"},
    {"CHORUS_SOCKET_IFNAME", "no-such-if0", Entry::kInitAll, "CHORUS_TRANSPORT=tcp"},
    {"CHORUS_STORE_BIND", "not-an-address", Entry::kUniqueId},
};

// Variables whose every value means something, and why.
const std::set<std::string> kFreeText = {
    "CHORUS_JOB_SECRET",     // 32 hex digits, or any other text hashed as a passphrase (README)
    "CHORUS_HOSTID",         // any text names the host
    "CHORUS_RESTART_COUNT",  // set by chorus-run; examples/train_cnn refuses a non-number
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
  for (Entry e : {Entry::kInitAll, Entry::kInitFromEnv, Entry::kUniqueId}) {
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
