// Elastic DDP on a GPU, host side, on the emulated cuda:0 of ddp_device_ddp (emulated_gpu.h: its
// memory shared, the CPU's kernels, the communicator's device path over the emulation): 3 ranks
// train with their buckets all-reduced on the device; rank 2 is killed with SIGKILL -- after the
// backward of step 5, whose hooks launched its all-reduces (its peers fail in the next step's
// exchange of buffer handles), or inside a device all-reduce of step 1 after that exchange,
// before it signals (CHORUS_TEST_DEVICE_DIE: its peers' streams wait on its flag words until
// the communicator's failure releases them). The survivors must name it, shrink, roll back to
// the last step all completed and go on -- ending with the parameters, bit for bit, of a
// reference run in which rank 2 leaves on purpose after that step (Trainer's `leave`: the same
// schedule of world sizes, no death). The recovery is train_cnn's (examples/train_cnn.cc,
// --elastic). Where CHORUS_TEST_TRAIN_DEVICE=cuda:0 (tests/gpu/run.sh), the cases tagged [killed]
// run on that GPU, the ranks sharing it.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/data/sampler.h"
#include "ddp/dist/distributed.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/train/trainer.h"
#include "emulated_gpu.h"
#include "harness.h"

using namespace chorus;
using chorus::test::run_ranks;
using chorus::test::RunOptions;

namespace {

const Device kGpu = Device::cuda(0);

// The GPU named by CHORUS_TEST_TRAIN_DEVICE (cuda:0 only), or the emulation.
bool real_gpu() {
  const char* named = std::getenv("CHORUS_TEST_TRAIN_DEVICE");
  if (named == nullptr || *named == '\0') return false;
  if (std::string(named) != kGpu.str())
    throw std::invalid_argument(std::string("CHORUS_TEST_TRAIN_DEVICE=") + named +
                                ": these cases run on cuda:0 only");
  return true;
}

RunOptions rank_options() {
  RunOptions o;
  o.env = {{"CHORUS_TIMEOUT", "30"}, {"CHORUS_ALLOW_SHARED_GPU", "1"}};
  if (!real_gpu()) o.env["CHORUS_TEST_GPU_UUID"] = "GPU-emulated-0";
  o.limit_seconds = 120;
  return o;
}

// kKill: SIGKILL in before_sync of step `step`; kDeviceDie: CHORUS_TEST_DEVICE_DIE=2 (in the
// communicator's second device collective: step 1's); kLeave: the reference, rank 2 leaving
// after global step `step`.
enum class Mode { kKill, kDeviceDie, kLeave };

// One rank's training: 3 ranks, one epoch of 384 samples at 16 a rank (8 steps), DDP on cuda:0
// with several buckets. Writes the final parameters to `out` (survivors only).
int train_rank(int rank, Mode mode, int64_t step, const std::string& out,
               const std::string& sync_dir = "", bool stuck = false) {
  if (!real_gpu()) {
    test::use_emulated_gpu();
    test::emulated_gpu().never_drains = stuck;  // the failed step's GPU work never ends
  }
  std::optional<Communicator> comm_storage(Communicator::from_env());
  Communicator* comm = &*comm_storage;
  auto data = make_synthetic(384, Shape{3, 32, 32}, 10, 11);
  Net model(3, 32, 7);
  model.to(kGpu);
  DdpOptions dopt;
  dopt.device = kGpu.str();
  dopt.reducer.first_bucket_bytes = 4096;
  dopt.reducer.bucket_cap_bytes = 65536;
  auto ddp = std::make_unique<DistributedDataParallel>(model, *comm, dopt);
  Sgd opt(model.parameters(), {.lr = 0.02f, .momentum = 0.9f, .weight_decay = 5e-4f});
  DistributedSampler sampler(data->size(), comm->size(), comm->rank(), /*shuffle=*/true, 4);
  LoaderOptions lo;
  lo.batch_size = 16;
  lo.seed = 4;
  DataLoader loader(data, lo, [&sampler](int64_t epoch) {
    sampler.set_epoch(epoch);
    return sampler.indices();
  });
  TrainOptions to;
  to.device = kGpu;
  to.epochs = 1;
  to.progress = false;
  to.comm = comm;
  to.ddp = ddp.get();
  to.sampler = &sampler;
  to.out = stdout;  // rank 0: the epoch's line, and the recovery's
  // What train_cnn --elastic does when a step fails: DDP on the shrunk communicator.
  to.recover = [&](const Error&) {
    ddp.reset();
    comm_storage.emplace(comm->shrink({}, CHORUS_SHRINK_AGREE));
    comm = &*comm_storage;
    DdpOptions d = dopt;
    d.broadcast_parameters = false;  // the trainer restores the same step on every rank
    ddp = std::make_unique<DistributedDataParallel>(model, *comm, d);
    return TrainOptions::Recovered{comm, ddp.get(), "rank 2"};
  };
  if (mode == Mode::kKill) {
    // After its backward (whose hooks launched the step's all-reduces), before it waits for
    // them: its peers finish the step and fail in the next one's exchange of buffer handles. On
    // the emulation rank 2 dies only once both peers have ended that step (each leaves a file
    // in `sync_dir`): a peer still inside the step's last all-reduce when the death is news
    // voids it and rolls back one step further (seen under ASan). On a GPU the kill is not
    // held back: it lands with the step's GPU work still pending, the case that hung there.
    const std::string done = sync_dir + "/done";
    if (rank < 2 && !real_gpu())
      to.after_step = [done, step, rank](int64_t g) {
        if (g == step) std::ofstream(done + std::to_string(rank)).put('\n');
      };
    if (rank == 2)
      to.before_sync = [done, step](int64_t g) {
        if (g != step) return;
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!real_gpu() && !(::access((done + "0").c_str(), F_OK) == 0 &&
                                ::access((done + "1").c_str(), F_OK) == 0)) {
          if (std::chrono::steady_clock::now() > end) break;  // the resume check then says so
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        ::kill(::getpid(), SIGKILL);
      };
  }
  if (mode == Mode::kLeave)
    to.leave = [&, left = false](int64_t g) mutable -> std::optional<TrainOptions::Recovered> {
      if (g != step || left) return std::nullopt;
      left = true;
      ddp.reset();
      Communicator small = comm->split(rank == 2 ? CHORUS_SPLIT_NOCOLOR : 0, comm->rank());
      if (rank == 2) {
        comm_storage.reset();
        std::fflush(nullptr);
        ::_exit(3);
      }
      comm_storage.emplace(std::move(small));
      comm = &*comm_storage;
      DdpOptions d = dopt;
      d.broadcast_parameters = false;
      ddp = std::make_unique<DistributedDataParallel>(model, *comm, d);
      return TrainOptions::Recovered{comm, ddp.get(), "rank 2"};
    };
  Trainer trainer(model, opt, loader, nullptr, to);
  trainer.run();
  std::ofstream f(out, std::ios::binary);
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector();
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(4 * v.size()));
  }
  std::printf("rank %d: trained, %s\n", rank, comm->size() == 2 ? "2 ranks at the end" : "?");
  return comm->size() == 2 ? 0 : 1;
}

// A stream that never ends can only be made on the emulation: on a GPU, these cases say so.
bool skipped_on_gpu() {
  if (!real_gpu()) return false;
  std::printf("skip: a stuck stream is the emulation's (never_drains), not a GPU's\n");
  return true;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The kill run, then the reference: rank 2 leaving after the step the survivors continued from
// (as ddp_elastic does: on a GPU, whether a killed rank's last enqueued signals ran before it
// died decides whether its step completed). `expect_resume`: that step on the emulation, where
// it is certain (every stream operation is done when enqueued); -1 on a GPU.
void run_case(Mode kill_mode, int64_t kill_in, int64_t expect_resume) {
  char dir_template[] = "/tmp/chorus-elastic-device-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  int64_t resume = -1;
  for (Mode mode : {kill_mode, Mode::kLeave}) {
    RunOptions o = rank_options();
    if (mode == Mode::kDeviceDie) o.env["CHORUS_TEST_DEVICE_DIE"] = "2";
    const std::string tag = mode == Mode::kLeave ? "leave" : "kill";
    const int64_t step = mode == Mode::kLeave ? resume : kill_in;
    auto res = run_ranks(
        3,
        [&](int rank) {
          return train_rank(rank, mode, step, dir + "/" + tag + std::to_string(rank) + ".bin", dir);
        },
        o);
    for (int r = 0; r < 3; ++r) {
      const auto& rr = res[static_cast<size_t>(r)];
      INFO(tag << " run, rank " << r << ":\n" << rr.output);
      CHECK(rr.exit_code == (r < 2 ? 0 : mode == Mode::kLeave ? 3 : -SIGKILL));
      // Rank 0 says why the step failed -- the death, not what it broke (a peer's memory that
      // could no longer be mapped, a stream wait released) -- and where the survivors go on.
      if (mode != Mode::kLeave && r == 0) {
        CHECK_THAT(rr.output, Catch::Contains("died at step") &&
                                  Catch::Contains("(its connection to the bootstrap store closed "
                                                  "without a goodbye); continuing with 2 ranks"));
        std::smatch m;
        if (std::regex_search(rr.output, m, std::regex("continuing with 2 ranks from step (\\d+)")))
          resume = std::stoll(m[1]);
      }
    }
    if (mode != Mode::kLeave) {
      REQUIRE(resume >= 0);
      if (!real_gpu()) CHECK(resume == expect_resume);
    }
  }
  for (int r = 0; r < 2; ++r) {
    const std::string leave = slurp(dir + "/leave" + std::to_string(r) + ".bin");
    const std::string kill = slurp(dir + "/kill" + std::to_string(r) + ".bin");
    INFO("rank " << r << ", the reference leaving after step " << resume);
    CHECK(!leave.empty());
    CHECK(kill.size() == leave.size());
    CHECK(kill == leave);  // (not printed: bytes)
  }
  CHECK(slurp(dir + "/leave0.bin") == slurp(dir + "/leave1.bin"));  // DDP kept them equal
  for (const char* f : {"leave0", "leave1", "kill0", "kill1", "done0", "done1"})
    std::remove((dir + "/" + f + ".bin").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace

TEST_CASE(
    "elastic DDP on cuda:0: a rank killed after a step's backward, the survivors go on to the "
    "parameters of a run it left on purpose",
    "[device][ddp][elastic][killed]") {
  // Its step's all-reduces were enqueued before it died: the survivors complete step 5.
  run_case(Mode::kKill, /*kill_in=*/5, /*expect_resume=*/5);
}

TEST_CASE(
    "elastic DDP on cuda:0: a rank killed inside a device all-reduce, while its peers' streams "
    "wait for it, the survivors go on as well",
    "[device][ddp][elastic][killed]") {
  run_case(Mode::kDeviceDie, /*kill_in=*/-1, /*expect_resume=*/0);  // dies in step 1
}

// Before the roll-back, the failed step's GPU work must end (a stream that still waited for the
// dead rank would hold every later copy and kernel): past the deadline the error says so.
TEST_CASE("elastic DDP on a GPU: a failed step's work that does not end is named, not waited for",
          "[device][ddp][elastic][emulated]") {
  if (skipped_on_gpu()) return;
  RunOptions o = rank_options();
  auto res = run_ranks(
      2,
      [](int rank) {
        test::use_emulated_gpu();
        auto comm = Communicator::from_env();
        Net model(3, 32, 7);
        model.to(kGpu);
        DdpOptions d;
        d.device = kGpu.str();
        DistributedDataParallel ddp(model, comm, d);
        ddp.reducer().drain(0.05);                 // done
        test::emulated_gpu().never_drains = true;  // what the trainer meets in the case below
        try {
          ddp.reducer().drain(0.05);
        } catch (const std::exception& e) {
          const std::string want =
              "ddp: the failed step's GPU work on cuda:0 did not end within "
              "0.05 s (a stream still waits for a signal from a rank that "
              "failed): cannot roll back";
          if (e.what() == want) return 0;
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return 1;
        }
        std::fprintf(stderr, "rank %d: no error\n", rank);
        return 1;
      },
      o);
  for (size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ":\n" << res[r].output);
    CHECK(res[r].exit_code == 0);
  }
}

TEST_CASE("elastic DDP on a GPU: the trainer does not roll back behind a stream that never ends",
          "[device][ddp][elastic][emulated]") {
  if (skipped_on_gpu()) return;
  char sync_template[] = "/tmp/chorus-elastic-stuck-XXXXXX";
  const std::string sync = ::mkdtemp(sync_template);
  RunOptions o = rank_options();
  auto res = run_ranks(
      3,
      [&sync](int rank) {
        return train_rank(rank, Mode::kKill, 5, "/dev/null", sync, /*stuck=*/true);
      },
      o);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ":\n" << res[static_cast<size_t>(r)].output);
    CHECK(res[static_cast<size_t>(r)].exit_code == 1);
    CHECK_THAT(res[static_cast<size_t>(r)].output,
               Catch::Contains("the failed step's GPU work on cuda:0 did not end within 30 s"));
  }
  for (const char* f : {"/done0", "/done1"}) std::remove((sync + f).c_str());
  ::rmdir(sync.c_str());
}
