// The mpirun rendezvous file (ranks started with OpenMPI's variables and no MASTER_ADDR):
// private, named by a hash, removed at the end, and never trusted on sight -- stale files,
// planted files and symbolic links cost a retry or a clear error, never the secret.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "chorus/chorus.hpp"
#include "common/socket.h"
#include "harness.h"
#include "probes.h"
#include "transport/wire.h"

using namespace chorus::test;

namespace {

const std::string kSecretHex = "00112233445566778899aabbccddeeff";

// A TMPDIR of this test's own, so that the per-user directory inside it is fresh.
struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/chorus-rdzv-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { (void)!std::system(("rm -rf " + path).c_str()); }
  std::string user_dir() const { return path + "/chorus-" + std::to_string(geteuid()); }
};

// The names in the per-user directory that hold a rendezvous record.
std::vector<std::string> records(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("rdzv-", 0) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// Turns a harness rank into an mpirun rank: OpenMPI's variables, no torchrun ones.
void as_mpirun_rank(int rank, int size, const std::string& tmpdir) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    unsetenv(v);
  setenv("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str(), 1);
  setenv("OMPI_COMM_WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("TMPDIR", tmpdir.c_str(), 1);
}

RunOptions options() {
  RunOptions o;
  o.env = {{"CHORUS_JOB_SECRET", kSecretHex}, {"CHORUS_TIMEOUT", "20"}};
  o.limit_seconds = 40;
  return o;
}

void require_ok(const std::vector<RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << " output:\n" << res[r].output);
    REQUIRE(res[r].exit_code == 0);
    REQUIRE_FALSE(sanitizer_report(res[r].output));
  }
}

// A job of 2 mpirun ranks; rank 0 starts `rank0_delay_s` after rank 1 (as a batch system may).
std::vector<RankResult> mpirun_job(const std::string& tmpdir, double rank0_delay_s) {
  return run_ranks(
      2,
      [&](int rank) {
        as_mpirun_rank(rank, 2, tmpdir);
        if (rank == 0) usleep(static_cast<useconds_t>(rank0_delay_s * 1e6));
        auto comm = chorus::Communicator::from_env();
        int v = rank == 0 ? 42 : 0;
        comm.broadcast(&v, 1, chorusInt32, 0);
        return v == 42 ? 0 : 7;
      },
      options());
}

// Listens on 127.0.0.1, answers every handshake with a challenge it cannot prove, and records
// everything its callers send. A process of its own (the ranks are forked from this one, and a
// process with threads must not fork under TSan).
struct Impostor {
  chorus::SockAddr addr;
  pid_t pid = -1;
  std::string log;  // what it heard, one line "connection" per caller, then the bytes
  Impostor() {
    char t[] = "/tmp/chorus-impostor-XXXXXX";
    int fd = mkstemp(t);
    close(fd);
    log = t;
    auto l = chorus::tcp_listen("127.0.0.1", 0, &addr);
    REQUIRE(l.is_ok());
    std::fflush(nullptr);
    pid = fork();
    if (pid == 0) {
      while (true) {
        auto c = chorus::tcp_accept(l->get(), chorus::Deadline::after_seconds(0.1), nullptr);
        if (!c.is_ok()) continue;
        std::string got = read_all(c->get(), 0.2);
        chorus::transport::Challenge ch;
        (void)!write(c->get(), &ch, sizeof ch);
        got += read_all(c->get(), 0.3);
        std::ofstream(log, std::ios::app) << "connection\n" << got;
      }
    }
  }
  ~Impostor() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    unlink(log.c_str());
  }
  std::string heard() const {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  int connections() const {
    std::string h = heard();
    int n = 0;
    for (size_t at = 0; (at = h.find("connection\n", at)) != std::string::npos; at += 11) ++n;
    return n;
  }
  bool heard_secret() const {
    chorus::transport::Secret s{};
    chorus::transport::parse_secret_hex(kSecretHex, &s);
    return heard().find(std::string(reinterpret_cast<const char*>(s.data()), s.size())) !=
           std::string::npos;
  }
};

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

std::string record_for(int port, int pid) {
  return "chorus-rdzv 1\nhost 127.0.0.1\nport " + std::to_string(port) + "\npid " +
         std::to_string(pid) + "\njob -\nstart 1\n";
}

}  // namespace

TEST_CASE("the rendezvous file is private, named by a hash, and gone when the job ends",
          "[adversarial][rendezvous]") {
  TempDir tmp;
  auto res = run_ranks(
      2,
      [&](int rank) {
        as_mpirun_rank(rank, 2, tmp.path);
        auto comm = chorus::Communicator::from_env();
        if (rank == 0) {
          struct stat st {};
          if (stat(tmp.user_dir().c_str(), &st) != 0 || (st.st_mode & 0777) != 0700 ||
              st.st_uid != geteuid())
            return 20;
          auto names = records(tmp.user_dir());
          if (names.size() != 1) return 21;
          if (stat((tmp.user_dir() + "/" + names[0]).c_str(), &st) != 0 ||
              (st.st_mode & 0777) != 0600)
            return 22;
          // Before: /tmp/chorus-rdzv-<the secret's first 16 hex digits>, mode 0644.
          if (names[0].find(kSecretHex.substr(0, 8)) != std::string::npos) return 23;
          std::printf("rendezvous file %s\n", names[0].c_str());
        }
        comm.barrier();
        return 0;
      },
      options());
  require_ok(res);
  INFO("left: " << (records(tmp.user_dir()).empty() ? "nothing" : records(tmp.user_dir())[0]));
  REQUIRE(records(tmp.user_dir()).empty());  // before: never removed
}

TEST_CASE("a stale file from a killed job is skipped, also when rank 1 starts first",
          "[adversarial][rendezvous]") {
  TempDir tmp;
  // A job whose rank 0 is killed: its file stays behind, naming a dead store.
  auto killed = run_ranks(
      2,
      [&](int rank) {
        as_mpirun_rank(rank, 2, tmp.path);
        try {
          auto comm = chorus::Communicator::from_env();
          comm.barrier();
          if (rank == 0) kill(getpid(), SIGKILL);
          comm.barrier();
        } catch (const chorus::Error&) {
        }
        return 0;
      },
      options());
  REQUIRE(killed[0].exit_code == -SIGKILL);
  REQUIRE(records(tmp.user_dir()).size() == 1);
  // Jobs with the same fixed secret, rank 1 first: each must find its own rank 0.
  for (int run = 0; run < 3; ++run) require_ok(mpirun_job(tmp.path, 0.5));
}

TEST_CASE("a planted file pointing at an impostor costs a retry, never the secret",
          "[adversarial][rendezvous]") {
  TempDir tmp;
  Impostor impostor;
  REQUIRE(mkdir(tmp.user_dir().c_str(), 0700) == 0);
  // The name is public knowledge for whoever knows the secret's hash; plant a live-looking record.
  std::string planted;
  {
    chorus::transport::Secret s{};
    chorus::transport::parse_secret_hex(kSecretHex, &s);
    auto name =
        fmt::format("rdzv-{:016x}", chorus::transport::derive_id(s, "chorus/v2/rendezvous-file"));
    planted = tmp.user_dir() + "/" + name;
  }
  write_file(planted, record_for(impostor.addr.port, getpid()), 0600);
  // Where the old code looked: /tmp/chorus-rdzv-<first 16 hex digits of the secret>.
  std::string old_path = "/tmp/chorus-rdzv-" + kSecretHex.substr(0, 16);
  write_file(old_path, "127.0.0.1\n" + std::to_string(impostor.addr.port) + "\n", 0644);
  auto res = mpirun_job(tmp.path, 1.0);
  unlink(old_path.c_str());
  require_ok(res);
  INFO("the impostor had " << impostor.connections() << " connection(s)");
  REQUIRE(impostor.connections() >= 1);    // rank 1 did try the planted address ...
  REQUIRE_FALSE(impostor.heard_secret());  // ... and sent nothing secret there
}

TEST_CASE("a file or directory planted by another user is refused", "[adversarial][rendezvous]") {
  if (geteuid() != 0) {
    WARN("skipped: needs root to plant files as another user");
    return;
  }
  const uid_t nobody = 65534;
  SECTION("a record owned by someone else is skipped") {
    TempDir tmp;
    Impostor impostor;
    REQUIRE(mkdir(tmp.user_dir().c_str(), 0700) == 0);
    chorus::transport::Secret s{};
    chorus::transport::parse_secret_hex(kSecretHex, &s);
    std::string planted =
        tmp.user_dir() + "/" +
        fmt::format("rdzv-{:016x}", chorus::transport::derive_id(s, "chorus/v2/rendezvous-file"));
    write_file(planted, record_for(impostor.addr.port, getpid()), 0600);
    REQUIRE(chown(planted.c_str(), nobody, nobody) == 0);
    require_ok(mpirun_job(tmp.path, 1.0));
    REQUIRE(impostor.connections() == 0);  // never even dialled
  }
  SECTION(
      "a per-user directory owned by someone else, or open to others, or a link, stops rank 0 with "
      "a reason") {
    TempDir tmp;
    REQUIRE(mkdir(tmp.user_dir().c_str(), 0700) == 0);
    std::string expect;
    int variant = GENERATE(0, 1, 2);
    if (variant == 0) {
      REQUIRE(chown(tmp.user_dir().c_str(), nobody, nobody) == 0);
      expect = "belongs to uid 65534";
    } else if (variant == 1) {
      REQUIRE(chmod(tmp.user_dir().c_str(), 0755) == 0);
      expect = "has mode 0755";
    } else {
      std::string elsewhere = tmp.path + "/elsewhere";
      REQUIRE(rename(tmp.user_dir().c_str(), elsewhere.c_str()) == 0);
      REQUIRE(symlink(elsewhere.c_str(), tmp.user_dir().c_str()) == 0);
      expect = "is a symbolic link";
    }
    auto res = run_ranks(
        1,
        [&](int) {
          as_mpirun_rank(0, 2, tmp.path);
          try {
            chorus::Communicator::from_env();
          } catch (const chorus::Error& e) {
            std::fprintf(stderr, "%s\n", e.what());
            return contains(e.what(), expect) ? 0 : 3;
          }
          return 4;
        },
        options());
    INFO(res[0].output);
    REQUIRE(res[0].exit_code == 0);
  }
}

TEST_CASE("a symbolic link planted at the file's name is replaced, its target untouched",
          "[adversarial][rendezvous]") {
  TempDir tmp;
  REQUIRE(mkdir(tmp.user_dir().c_str(), 0700) == 0);
  chorus::transport::Secret s{};
  chorus::transport::parse_secret_hex(kSecretHex, &s);
  std::string name =
      fmt::format("rdzv-{:016x}", chorus::transport::derive_id(s, "chorus/v2/rendezvous-file"));
  std::string victim = tmp.path + "/victim";
  write_file(victim, "precious\n", 0644);
  REQUIRE(symlink(victim.c_str(), (tmp.user_dir() + "/" + name).c_str()) == 0);
  require_ok(mpirun_job(tmp.path, 0.3));
  std::ifstream f(victim);
  std::stringstream ss;
  ss << f.rdbuf();
  REQUIRE(ss.str() == "precious\n");
  struct stat st {};
  REQUIRE(lstat((tmp.user_dir() + "/" + name).c_str(), &st) !=
          0);  // removed at the end, link and all
}
