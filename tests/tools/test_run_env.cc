// chorus-run tests: the variables each worker gets, the port, the secret, and usage errors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/tools/launch_harness.h"

using chorus::test::helper;
using chorus::test::run_launcher;
using chorus::test::values_by_rank;

namespace {

bool can_bind(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

bool is_hex128(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST_CASE("chorus-run sets rank variables for -n 1..4", "[chorus-run]") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto r = run_launcher({"--standalone", "-n", std::to_string(n), helper(), "env"});
    REQUIRE(r.exit_code == 0);
    auto rank = values_by_rank(r.out, "RANK");
    REQUIRE(rank.size() == static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(rank[i] == std::to_string(i));
      CHECK(values_by_rank(r.out, "LOCAL_RANK")[i] == std::to_string(i));
      CHECK(values_by_rank(r.out, "WORLD_SIZE")[i] == std::to_string(n));
      CHECK(values_by_rank(r.out, "LOCAL_WORLD_SIZE")[i] == std::to_string(n));
      CHECK(values_by_rank(r.out, "GROUP_RANK")[i] == "0");
      CHECK(values_by_rank(r.out, "MASTER_ADDR")[i] == "127.0.0.1");
      CHECK(values_by_rank(r.out, "CHORUS_RESTART_COUNT")[i] == "0");
      CHECK(values_by_rank(r.out, "TORCHELASTIC_RESTART_COUNT")[i] == "0");
    }
  }
}

TEST_CASE("chorus-run picks one free port for all ranks", "[chorus-run]") {
  auto r = run_launcher({"-n", "3", helper(), "env"});
  REQUIRE(r.exit_code == 0);
  auto ports = values_by_rank(r.out, "MASTER_PORT");
  REQUIRE(ports.size() == 3);
  CHECK(ports[1] == ports[0]);
  CHECK(ports[2] == ports[0]);
  int port = std::stoi(ports[0]);
  CHECK(port > 0);
  CHECK(port <= 65535);
  CHECK(can_bind(port));  // it was free (and the launcher did not keep it)

  auto given = run_launcher({"-n", "2", "--master-port", "29877", helper(), "env"});
  REQUIRE(given.exit_code == 0);
  CHECK(values_by_rank(given.out, "MASTER_PORT")[1] == "29877");
}

TEST_CASE("chorus-run gives every rank the same secret, new for each launch", "[chorus-run]") {
  auto a = run_launcher({"-n", "3", helper(), "env"});
  auto b = run_launcher({"-n", "3", helper(), "env"});
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  auto sa = values_by_rank(a.out, "CHORUS_JOB_SECRET");
  auto sb = values_by_rank(b.out, "CHORUS_JOB_SECRET");
  REQUIRE(sa.size() == 3);
  CHECK(is_hex128(sa[0]));
  CHECK(sa[1] == sa[0]);
  CHECK(sa[2] == sa[0]);
  CHECK(sb[0] != sa[0]);

  auto given = run_launcher({"-n", "2", helper(), "env"},
                            {"CHORUS_JOB_SECRET=00112233445566778899aabbccddeeff"});
  CHECK(values_by_rank(given.out, "CHORUS_JOB_SECRET")[1] == "00112233445566778899aabbccddeeff");
}

TEST_CASE("chorus-run multi-node: global ranks, world size, shared secret", "[chorus-run]") {
  auto node = [](int node_rank, const std::string& id) {
    return run_launcher({"--nnodes", "2", "--node-rank", std::to_string(node_rank), "-n", "2",
                         "--master-addr", "127.0.0.1", "--master-port", "29999", "--rdzv-id", id,
                         helper(), "env"});
  };
  auto n1 = node(1, "job-7");
  REQUIRE(n1.exit_code == 0);
  auto rank = values_by_rank(n1.out, "RANK");
  REQUIRE(rank.size() == 2);  // keyed by the "[R] " prefix: global ranks 2 and 3
  CHECK(rank[2] == "2");
  CHECK(rank[3] == "3");
  CHECK(values_by_rank(n1.out, "LOCAL_RANK")[3] == "1");
  CHECK(values_by_rank(n1.out, "WORLD_SIZE")[3] == "4");
  CHECK(values_by_rank(n1.out, "LOCAL_WORLD_SIZE")[3] == "2");
  CHECK(values_by_rank(n1.out, "GROUP_RANK")[2] == "1");
  CHECK(values_by_rank(n1.out, "MASTER_PORT")[2] == "29999");

  auto n0 = node(0, "job-7");
  auto other_job = node(0, "job-8");
  std::string secret = values_by_rank(n1.out, "CHORUS_JOB_SECRET")[2];
  CHECK(is_hex128(secret));
  CHECK(values_by_rank(n0.out, "CHORUS_JOB_SECRET")[0] == secret);
  CHECK(values_by_rank(other_job.out, "CHORUS_JOB_SECRET")[0] != secret);

  auto rdzv = run_launcher({"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "1",
                            "--rdzv_endpoint", "localhost:29777", helper(), "env"});
  REQUIRE(rdzv.exit_code == 0);
  CHECK(values_by_rank(rdzv.out, "MASTER_ADDR")[1] == "localhost");
  CHECK(values_by_rank(rdzv.out, "MASTER_PORT")[1] == "29777");
  CHECK(values_by_rank(rdzv.out, "RANK")[1] == "1");
}

TEST_CASE("chorus-run reports bad usage clearly", "[chorus-run]") {
  auto none = run_launcher({"-n", "2"});
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.err, Catch::Contains("missing the program"));

  auto zero = run_launcher({"-n", "0", helper(), "env"});
  CHECK(zero.exit_code == 2);
  CHECK_THAT(zero.err, Catch::Contains("at least 1, got 0"));

  auto missing = run_launcher({"-n", "2", "no-such-program-xyz"});
  CHECK(missing.exit_code == 127);
  CHECK_THAT(missing.err, Catch::Contains("'no-such-program-xyz' not found"));

  auto missing_path = run_launcher({"./no/such/prog"});
  CHECK(missing_path.exit_code == 127);
  CHECK_THAT(missing_path.err, Catch::Contains("'./no/such/prog'"));

  char path[] = "/tmp/chorus-run-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  auto not_exec = run_launcher({path});
  unlink(path);
  CHECK(not_exec.exit_code == 126);
  CHECK_THAT(not_exec.err, Catch::Contains(path) && Catch::Contains("not executable"));

  auto port = run_launcher({"--master-port", "70000", helper(), "env"});
  CHECK(port.exit_code == 2);
  CHECK_THAT(port.err, Catch::Contains("bad port '70000'"));

  auto endpoint = run_launcher({"--rdzv-endpoint", "host:abc", helper(), "env"});
  CHECK(endpoint.exit_code == 2);
  CHECK_THAT(endpoint.err, Catch::Contains("bad --rdzv-endpoint 'host:abc'"));
  // Found by fuzz/run_endpoint: this was host "fe80:" port 1.
  auto unbracketed = run_launcher({"--rdzv-endpoint", "fe80::1", helper(), "env"});
  CHECK(unbracketed.exit_code == 2);
  CHECK_THAT(unbracketed.err, Catch::Contains("bad --rdzv-endpoint 'fe80::1'") &&
                                  Catch::Contains("[fe80::1]:29500"));

  auto standalone = run_launcher({"--standalone", "--nnodes", "2", helper(), "env"});
  CHECK(standalone.exit_code == 2);

  auto no_addr = run_launcher({"--nnodes", "2", helper(), "env"});
  CHECK(no_addr.exit_code == 2);
  CHECK_THAT(no_addr.err, Catch::Contains("needs --master-addr"));

  auto help = run_launcher({"--help"});
  CHECK(help.exit_code == 0);
  for (const char* word :
       {"--nproc-per-node", "--nnodes",        "--node-rank",       "--master-addr",
        "--master-port",    "--rdzv-endpoint", "--rdzv-id",         "--max-restarts",
        "--grace",          "--no-prefix",     "--standalone",      "RANK",
        "WORLD_SIZE",       "LOCAL_RANK",      "LOCAL_WORLD_SIZE",  "GROUP_RANK",
        "MASTER_ADDR",      "MASTER_PORT",     "CHORUS_JOB_SECRET", "CHORUS_RESTART_COUNT"}) {
    CHECK_THAT(help.out, Catch::Contains(word));
  }
}

// --mps, with a stand-in for CUDA's nvidia-cuda-mps-control on PATH (`-d` makes the control
// pipe; "quit" on its stdin removes it; each call logged): the workers inherit the job's pipe
// directory with the daemon's pipe in it, the daemon is asked to quit at the end and the
// directories go; one already running is used and left alone; none on PATH is an error naming
// the program.
TEST_CASE("chorus-run --mps runs an MPS daemon for the job and stops it", "[chorus-run]") {
  char dir_template[] = "/tmp/chorus-test-mps-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string log = dir + "/calls.log";
  {
    std::FILE* f = std::fopen((dir + "/nvidia-cuda-mps-control").c_str(), "w");
    REQUIRE(f);
    std::fputs(
        "#!/bin/sh\n"
        "echo \"call $* $CUDA_MPS_PIPE_DIRECTORY\" >> \"$FAKE_MPS_LOG\"\n"
        "if [ \"$1\" = -d ]; then mkfifo \"$CUDA_MPS_PIPE_DIRECTORY/control\"; exit 0; fi\n"
        "read cmd; echo \"stdin $cmd\" >> \"$FAKE_MPS_LOG\"\n"
        "[ \"$cmd\" = quit ] && rm -f \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n",
        f);
    std::fclose(f);
    chmod((dir + "/nvidia-cuda-mps-control").c_str(), 0755);
  }
  const std::string path = "PATH=" + dir + ":" + std::getenv("PATH");
  const std::vector<std::string> report = {
      "/bin/sh", "-c",
      "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; test -p $CUDA_MPS_PIPE_DIRECTORY/control && echo "
      "CONTROL=yes"};
  std::vector<std::string> args = {"-n", "2", "--mps"};
  args.insert(args.end(), report.begin(), report.end());
  auto r = run_launcher(args, {path, "FAKE_MPS_LOG=" + log, "CUDA_MPS_PIPE_DIRECTORY"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto pipe = values_by_rank(r.out, "PIPE");
  REQUIRE(pipe.size() == 2);
  CHECK(pipe[0] == pipe[1]);
  CHECK(pipe[0].rfind("/tmp/chorus-mps-", 0) == 0);
  CHECK(values_by_rank(r.out, "CONTROL")[1] == "yes");
  std::ifstream in(log);
  const std::string calls((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(calls == "call -d " + pipe[0] + "\ncall  " + pipe[0] + "\nstdin quit\n");
  CHECK(access(pipe[0].c_str(), F_OK) != 0);  // its directories removed
  // A daemon already running: used, not started or stopped.
  std::remove(log.c_str());
  const std::string running = dir + "/running";
  mkdir(running.c_str(), 0700);
  mkfifo((running + "/control").c_str(), 0600);
  auto again =
      run_launcher(args, {path, "FAKE_MPS_LOG=" + log, "CUDA_MPS_PIPE_DIRECTORY=" + running});
  INFO(again.out << again.err);
  REQUIRE(again.exit_code == 0);
  CHECK(values_by_rank(again.out, "PIPE")[0] == running);
  CHECK(again.err.find("using the MPS daemon already running") != std::string::npos);
  CHECK(access(log.c_str(), F_OK) != 0);  // never called
  // None on PATH.
  auto none = run_launcher({"-n", "1", "--mps", "/bin/true"},
                           {"PATH=/nonexistent", "CUDA_MPS_PIPE_DIRECTORY"});
  CHECK(none.exit_code == 1);
  CHECK(none.err.find("'nvidia-cuda-mps-control' not found") != std::string::npos);
  std::remove((running + "/control").c_str());
  rmdir(running.c_str());
  std::remove((dir + "/nvidia-cuda-mps-control").c_str());
  rmdir(dir.c_str());
}
