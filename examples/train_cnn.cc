// train_cnn: trains the PyTorch CIFAR-10 tutorial CNN (Fashion-MNIST by default), in one process
// or data-parallel over N processes (DDP over chorus) when started by chorus-run or mpirun.
//
//   train_cnn --data fashion-mnist --epochs 3 --batch-size 64 --lr 0.01 --momentum 0.9 --seed 0
//   chorus-run -n 2 train_cnn --batch-size 32 --log-every 100   # per-rank batch 32, effective 64
//   chorus-run -n 2 --max-restarts 3 train_cnn --checkpoint-dir ckpt --checkpoint-every 200
//   train_cnn --data cifar10:/path/to/cifar-10-batches-bin
//   train_cnn --data synthetic --synthetic-size 2000 --synthetic-shape 3x32x32
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "ddp/data/data_loader.h"
#include "ddp/data/dataset.h"
#include "ddp/data/sampler.h"
#include "ddp/dist/dist_utils.h"
#include "ddp/dist/distributed.h"
#include "ddp/dist/rejoin.h"
#include "ddp/nn/modules.h"
#include "ddp/nn/optim.h"
#include "ddp/ops/kernel_table.h"
#include "ddp/tensor/device_cache.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/trainer.h"

namespace {

struct Data {
  std::shared_ptr<chorus::Dataset> train, test;
  std::string name;
};

chorus::Shape parse_shape(const std::string& s) {
  int c = 0, h = 0, w = 0;
  if (std::sscanf(s.c_str(), "%dx%dx%d", &c, &h, &w) != 3 || c < 1 || h < 1 || w < 1)
    throw std::invalid_argument(
        fmt::format("--synthetic-shape: expected CxHxW like 3x32x32, got '{}'", s));
  return chorus::Shape{c, h, w};
}

Data load_data(const std::string& spec, int64_t synthetic_size, const std::string& synthetic_shape,
               uint64_t seed) {
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string dir = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "fashion-mnist" || kind == "mnist") {
    const std::string d = dir.empty() ? chorus::kFashionMnistDir : dir;
    return {chorus::load_mnist_dir(d, true), chorus::load_mnist_dir(d, false),
            kind + " (" + d + ")"};
  }
  if (kind == "cifar10") {
    if (dir.empty())
      throw std::invalid_argument("--data: expected cifar10:DIR, got cifar10 without a directory");
    return {chorus::load_cifar10_dir(dir, true), chorus::load_cifar10_dir(dir, false),
            "cifar10 (" + dir + ")"};
  }
  if (kind == "synthetic") {
    const chorus::Shape shape = parse_shape(synthetic_shape);
    const int64_t test_size = std::max<int64_t>(1, synthetic_size / 5);
    return {chorus::make_synthetic(synthetic_size, shape, 10, seed),
            chorus::make_synthetic(test_size, shape, 10, seed, 1),
            fmt::format("synthetic {} x {}", synthetic_size, shape.str())};
  }
  throw std::invalid_argument(fmt::format(
      "--data: expected fashion-mnist[:DIR], mnist:DIR, cifar10:DIR or synthetic, got '{}'", spec));
}

// Launched as one rank of several (chorus-run, torchrun-style variables, mpirun or srun)?
bool launched_distributed() {
  for (const char* k : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = std::getenv(k))
      return std::atoi(v) >= 1 && (std::string(k) != "SLURM_NTASKS" || std::getenv("SLURM_PROCID"));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "train the PyTorch CIFAR-10 tutorial CNN with chorus, in one process or DDP over "
      "chorus-run/mpirun"};
  std::string data_spec = "fashion-mnist", synthetic_shape = "3x32x32";
  int epochs = 3, threads = 1;
  int64_t batch_size = 64, synthetic_size = 10000, max_steps = -1;
  float lr = 0.01f, momentum = 0.9f, weight_decay = 0.0f;
  bool nesterov = false, no_progress = false, keep_denormals = false;
  uint64_t seed = 0;
  app.add_option("--data", data_spec, "fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | synthetic")
      ->capture_default_str();
  app.add_option("--epochs", epochs)->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str();
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--momentum", momentum)->capture_default_str();
  app.add_option("--weight-decay", weight_decay)->capture_default_str();
  app.add_flag("--nesterov", nesterov);
  app.add_option("--seed", seed)->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_option("--synthetic-size", synthetic_size, "training samples for --data synthetic")
      ->capture_default_str();
  app.add_option("--synthetic-shape", synthetic_shape, "CxHxW for --data synthetic")
      ->capture_default_str();
  app.add_option("--max-steps", max_steps,
                 "stop each epoch after this many steps (< 0: whole epoch)");
  app.add_flag("--no-progress", no_progress, "no progress bar or progress lines");
  app.add_flag(
      "--keep-denormals", keep_denormals,
      "compute with denormal floats (default: flush them to zero, see ddp/ops/kernel_table.h)");
  std::string device = "cpu", checkpoint_dir;
  int64_t log_every = 0, checkpoint_every = 0, fail_at_step = -1;
  double first_bucket_mb = 1.0, bucket_cap_mb = 25.0;
  bool per_rank = false, single = false, cuda_graph = false, cuda_graph_split = false;
  int fail_rank = 0;
  app.add_option("--device", device,
                 "cpu | cuda | cuda:N | auto (cuda = cuda:$LOCAL_RANK; auto = that where a GPU "
                 "is visible, else cpu)")
      ->capture_default_str();
  app.add_option("--log-every", log_every,
                 "one global loss/accuracy/images-per-s line every N steps (0: progress bar)");
  app.add_flag("--per-rank", per_rank, "also print each rank's own interval line");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "write snapshots here (each epoch) and resume from the newest one found at start");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "also a snapshot every N steps (needs --checkpoint-dir)");
  app.add_option("--first-bucket-mb", first_bucket_mb,
                 "DDP: size of the first gradient bucket, MiB")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", bucket_cap_mb, "DDP: size cap of the other buckets, MiB")
      ->capture_default_str();
  app.add_flag("--single", single, "ignore launcher variables: train in this process alone");
  app.add_flag("--cuda-graph", cuda_graph,
               "capture the training step as a CUDA graph and replay it (on a GPU; with DDP the "
               "gradient all-reduces are captured in it; ddp/train/step_graph.h)");
  app.add_flag("--cuda-graph-split", cuda_graph_split,
               "as --cuda-graph, but with DDP always two graphs a step, the all-reduces between "
               "(to compare with the one-graph step)");
  app.add_option("--fail-at-step", fail_at_step,
                 "testing: SIGKILL --fail-rank after this global step (first launch only)")
      ->group("");
  app.add_option("--fail-rank", fail_rank, "testing: the rank --fail-at-step kills")->group("");
  bool elastic = false, fail_in_sync = false, fail_in_backward = false, fail_in_checkpoint = false,
       fail_in_eval = false;
  app.add_flag("--fail-in-sync", fail_in_sync,
               "testing: --fail-at-step kills inside that step, while its gradients are being "
               "all-reduced")
      ->group("");
  app.add_flag("--fail-in-backward", fail_in_backward,
               "testing: --fail-at-step kills inside that step's backward, when the first "
               "parameter's gradient is ready (the last; with small buckets, the later ones' "
               "all-reduces are in flight then)")
      ->group("");
  app.add_flag("--fail-in-eval", fail_in_eval,
               "testing: --fail-at-step kills in the evaluation at the end of the epoch whose "
               "last global step it is")
      ->group("");
  app.add_flag("--fail-in-checkpoint", fail_in_checkpoint,
               "testing: --fail-at-step kills while that step's snapshot is being written (after "
               "its tensors, before its record; the writer is rank 0)")
      ->group("");
  std::string sample_log_dir;
  int64_t await_rejoin_at = -1, leave_at = -1;
  std::vector<int> leave_ranks;
  app.add_flag("--elastic", elastic,
               "keep training when ranks die: the survivors shrink the communicator, roll back "
               "to the last step they all completed, share the rest of the epoch and go on (on by "
               "default under chorus-run --elastic)");
  app.add_option("--await-rejoin-at", await_rejoin_at,
                 "testing (chorus-run --elastic --max-restarts): rank 0 waits before global step "
                 "G until a restarted worker asks to rejoin")
      ->group("");
  app.add_option(
         "--leave-at", leave_at,
         "testing (--elastic): after global step G, the ranks --leave-rank R[,R...] leave and "
         "the others go on, as after their death but without one (the reference of a killed "
         "run)")
      ->group("");
  app.add_option("--leave-rank", leave_ranks, "testing: see --leave-at")->delimiter(',')->group("");
  app.add_option("--sample-log", sample_log_dir,
                 "testing: each rank writes the samples of its steps to DIR/rank<R>.txt")
      ->group("");
  CLI11_PARSE(app, argc, argv);

  std::optional<chorus::Communicator> comm_storage;
  chorus::Communicator* comm = nullptr;
  try {
    // A worker chorus-run --elastic --max-restarts restarted: it joins the running job below,
    // once its data and model are ready (ddp/dist/rejoin.h).
    const std::string elastic_dir = chorus::elastic_dir();
    const int rejoin = chorus::elastic_rejoin_count();
    if (rejoin > 0 && elastic_dir.empty())
      throw std::invalid_argument("CHORUS_ELASTIC_REJOIN is set but CHORUS_ELASTIC_DIR is not");
    if (!single && launched_distributed() && rejoin == 0) {
      comm_storage.emplace(chorus::Communicator::from_env());
      comm = &*comm_storage;
    }
    int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
    // Who this worker is in the job (RANK): a restarted worker keeps the dead one's.
    const char* env_rank = std::getenv("RANK");
    const int64_t job_rank = comm || !env_rank ? rank : std::atoll(env_rank);
    chorus::set_cpu_threads(threads);
    chorus::set_flush_denormal(!keep_denormals);
    Data data;
    // Rank 0 reads (and, for a real download, would fetch) the data first; the others follow.
    // (A restarted worker reads it alone: the running ranks are training.)
    if (comm)
      chorus::rank_zero_first(
          *comm, [&] { data = load_data(data_spec, synthetic_size, synthetic_shape, seed); });
    else
      data = load_data(data_spec, synthetic_size, synthetic_shape, seed);
    const chorus::Shape s = data.train->sample_shape();
    if (s[1] != s[2] || s[1] < 16)
      throw std::invalid_argument(
          fmt::format("train_cnn: {}: expected square images of side >= 16, got {}",
                      data.train->origin().empty() ? data.name : data.train->origin(), s.str()));
    // cpu, cuda[:N] or auto (cuda:LOCAL_RANK where a GPU is visible, else cpu).
    // (DDP first checks, on every rank, that no two ranks of a host were given one device.)
    const chorus::Device dev = chorus::Device::parse(device, chorus::env_local_rank());
    if (comm) chorus::check_devices(*comm, dev);  // two ranks on one device: named first
    if (const std::string why = chorus::kernels_unavailable(dev); !why.empty())
      throw std::invalid_argument(fmt::format(
          "train_cnn: --device {} ({}): {} ({} CUDA device(s) visible); use --device cpu or auto",
          device, dev.str(), why, chorus::cuda_backend().count()));
    chorus::Net model(static_cast<int>(s[0]), static_cast<int>(s[1]), seed);
    if (!dev.is_cpu()) model.to(dev);  // initialised on the cpu (the same values), then moved
    std::vector<int64_t> members;      // job ranks of the current communicator, by rank
    // Gathers who is in the communicator now; those not in `members` before, as "rank 1,3".
    auto newcomers = [&]() {
      std::vector<int64_t> now(static_cast<size_t>(comm->size()));
      comm->all_gather(&job_rank, now.data(), 1, chorusInt64);
      std::string who;
      for (int64_t r : now)
        if (std::find(members.begin(), members.end(), r) == members.end())
          who += fmt::format("{}{}", who.empty() ? "" : ",", r);
      std::swap(members, now);
      return fmt::format("rank{} {}", who.find(',') != std::string::npos ? "s" : "", who);
    };
    if (rejoin > 0) {
      auto joined = chorus::request_join(elastic_dir, 300.0);
      if (!joined) {
        fmt::print(stderr, "train_cnn: rank {}: the job finished before this worker could rejoin\n",
                   job_rank);
        return 0;
      }
      comm_storage.emplace(std::move(*joined));
      comm = &*comm_storage;
      rank = comm->rank();
      world = comm->size();
      newcomers();  // as the running ranks do in `grow` below
    }
    cuda_graph = cuda_graph || cuda_graph_split;
    if (cuda_graph && dev.is_cpu())
      throw std::invalid_argument(std::string("train_cnn: ") +
                                  (cuda_graph_split ? "--cuda-graph-split" : "--cuda-graph") +
                                  " needs --device cuda, got " + dev.str());
    // One rank under a launcher with --cuda-graph trains as one process (its whole step one
    // graph); several ranks with DDP (one graph a step, or two with the all-reduces between).
    chorus::Communicator* const train_comm = cuda_graph && world == 1 ? nullptr : comm;
    std::unique_ptr<chorus::DistributedDataParallel> ddp;
    chorus::DdpOptions dopt;
    if (rejoin > 0) dopt.broadcast_parameters = false;  // the trainer sends the state
    if (train_comm) {
      dopt.device = dev.str();
      dopt.reducer.first_bucket_bytes = static_cast<size_t>(first_bucket_mb * 1048576.0);
      dopt.reducer.bucket_cap_bytes = static_cast<size_t>(bucket_cap_mb * 1048576.0);
      ddp = std::make_unique<chorus::DistributedDataParallel>(model, *comm, dopt);
    }
    chorus::Sgd optimizer(model.parameters(), {.lr = lr,
                                               .momentum = momentum,
                                               .dampening = 0.0f,
                                               .weight_decay = weight_decay,
                                               .nesterov = nesterov});
    chorus::TrainState resume;
    if (!checkpoint_dir.empty()) {
      if (auto snap = chorus::load_latest_snapshot(checkpoint_dir)) {
        if (snap->state.world_size != world || snap->state.batch_size != batch_size)
          chorus::print_primary(
              comm,
              "train_cnn: note: {} was written by {} rank(s) at batch {}; now {} at batch {}\n",
              snap->path, snap->state.world_size, snap->state.batch_size, world, batch_size);
        chorus::apply_snapshot(*snap, model, optimizer);
        resume = snap->state;
        chorus::print_primary(
            comm, "train_cnn: resuming from {} (epoch {}, step {} of it, global step {})\n",
            snap->path, resume.epoch, resume.step_in_epoch, resume.global_step);
      }
    }
    chorus::DistributedSampler sampler(data.train->size(), world, rank, /*shuffle=*/true, seed);
    chorus::LoaderOptions lo;
    lo.batch_size = batch_size;
    lo.seed = seed;
    chorus::DataLoader loader(data.train, lo, [&sampler](int64_t epoch) {
      sampler.set_epoch(epoch);
      return sampler.indices();
    });
    chorus::TrainOptions to;
    to.device = dev;
    to.epochs = epochs;
    to.max_steps_per_epoch = max_steps;
    to.progress = !no_progress;
    to.comm = train_comm;
    to.ddp = ddp.get();
    to.cuda_graph = cuda_graph;
    to.cuda_graph_split = cuda_graph_split;
    to.log_every = log_every;
    to.per_rank_log = per_rank;
    to.checkpoint_dir = checkpoint_dir;
    to.checkpoint_every = checkpoint_every;
    to.resume = resume;
    to.seed = seed;
    to.batch_size = batch_size;
    const char* restarts = std::getenv("CHORUS_RESTART_COUNT");
    char* restarts_end = nullptr;
    const long restart_count = restarts ? std::strtol(restarts, &restarts_end, 10) : 0;
    if (restarts && (restarts_end == restarts || *restarts_end != '\0' || restart_count < 0))
      throw std::invalid_argument(std::string("env CHORUS_RESTART_COUNT='") + restarts +
                                  "' is not a count of restarts");
    // Elastic: on under chorus-run --elastic (which hosts the store, so any rank may die).
    if (const char* host = std::getenv("CHORUS_STORE_HOST");
        host && std::string(host) == "launcher")
      elastic = true;
    if (rejoin == 0)
      for (int r = 0; r < world; ++r) members.push_back(r);
    if (elastic && comm) {
      to.sampler = &sampler;
      to.recover = [&](const chorus::Error&) {
        ddp.reset();  // its gradient hooks go quiet
        chorus::Communicator small = comm->shrink({}, CHORUS_SHRINK_AGREE);
        comm_storage.emplace(std::move(small));
        comm = &*comm_storage;
        std::vector<int64_t> now(static_cast<size_t>(comm->size()));
        comm->all_gather(&job_rank, now.data(), 1, chorusInt64);
        std::string lost;
        for (int64_t r : members)
          if (std::find(now.begin(), now.end(), r) == now.end())
            lost += fmt::format("{}{}", lost.empty() ? "" : ",", r);
        const bool several = lost.find(',') != std::string::npos;
        members = now;
        chorus::DdpOptions d = dopt;
        d.broadcast_parameters = false;  // the trainer restores the same step on every rank
        ddp = std::make_unique<chorus::DistributedDataParallel>(model, *comm, d);
        return chorus::TrainOptions::Recovered{comm, ddp.get(),
                                               fmt::format("rank{} {}", several ? "s" : "", lost)};
      };
      if (!elastic_dir.empty()) {  // chorus-run --elastic --max-restarts: dead workers rejoin
        // Test hook --await-rejoin-at G: rank 0 lets nobody in before step G, and there waits (up
        // to 60 s) for a restarted worker, so the join lands there whatever the machine's speed.
        to.joiners_waiting = [&, awaited = false](int64_t g) mutable {
          if (g < await_rejoin_at) return 0;  // the join lands at G, however fast the worker
          int n = chorus::count_join_requests(elastic_dir);
          for (int i = 0; g == await_rejoin_at && !awaited && n == 0 && i < 6000; ++i) {
            ::usleep(10000);
            n = chorus::count_join_requests(elastic_dir);
          }
          awaited = awaited || g == await_rejoin_at;
          return n;
        };
        to.grow = [&](int n) {
          ddp.reset();
          chorus::Communicator big = chorus::grant_and_grow(*comm, elastic_dir, n);
          comm_storage.emplace(std::move(big));
          comm = &*comm_storage;
          std::string joined = newcomers();
          chorus::DdpOptions d = dopt;
          d.broadcast_parameters = false;  // the trainer sends rank 0's state to all
          ddp = std::make_unique<chorus::DistributedDataParallel>(model, *comm, d);
          return chorus::TrainOptions::Recovered{comm, ddp.get(), joined};
        };
        to.joined = rejoin > 0;
      }
      if (leave_at >= 0)
        to.leave =
            [&, left = false](int64_t g) mutable -> std::optional<chorus::TrainOptions::Recovered> {
          if (g != leave_at || left) return std::nullopt;
          left = true;
          ddp.reset();
          const bool me =
              std::find(leave_ranks.begin(), leave_ranks.end(), job_rank) != leave_ranks.end();
          chorus::Communicator small =
              comm->split(me ? CHORUS_SPLIT_NOCOLOR : 0, comm->rank());  // keeps the order
          if (me) {  // says goodbye (leaving is not dying), then exits 3: under chorus-run
                     // --elastic --max-restarts it is restarted and rejoins, as a killed one is
            fmt::print(stderr, "train_cnn: test hook: rank {} leaves after step {}\n", job_rank, g);
            comm_storage.reset();
            std::fflush(nullptr);
            ::_exit(3);
          }
          comm_storage.emplace(std::move(small));
          comm = &*comm_storage;
          std::vector<int64_t> now(static_cast<size_t>(comm->size()));
          comm->all_gather(&job_rank, now.data(), 1, chorusInt64);
          members = now;
          chorus::DdpOptions d = dopt;
          d.broadcast_parameters = false;
          ddp = std::make_unique<chorus::DistributedDataParallel>(model, *comm, d);
          return chorus::TrainOptions::Recovered{
              comm, ddp.get(),
              fmt::format("rank{} {}", leave_ranks.size() > 1 ? "s" : "",
                          fmt::join(leave_ranks, ","))};
        };
    }
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> sample_log(nullptr, &std::fclose);
    if (!sample_log_dir.empty()) {
      const std::string path =
          rejoin > 0 ? fmt::format("{}/rank{}.rejoin{}.txt", sample_log_dir, job_rank, rejoin)
                     : fmt::format("{}/rank{}.txt", sample_log_dir, rank);
      sample_log.reset(std::fopen(path.c_str(), "w"));
      if (!sample_log) throw std::runtime_error("train_cnn: cannot write " + path);
      to.sample_log = sample_log.get();
    }
    // Test hook: SIGKILL this rank after step --fail-at-step, inside it (--fail-in-sync), or
    // while its snapshot is written (--fail-in-checkpoint). It says when, so bench/elastic.sh
    // can time the survivors' recovery from the kill.
    auto die = [rank](int64_t step, int64_t at) {
      if (step != at) return;
      timespec ts{};
      clock_gettime(CLOCK_REALTIME, &ts);
      fmt::print(stderr, "train_cnn: test hook: rank {} kills itself in step {} at {:.6f}\n", rank,
                 step, static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec));
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    };
    if (fail_at_step >= 0 && rank == fail_rank && restart_count == 0 && rejoin == 0) {
      if (fail_in_checkpoint)  // rank 0 writes: between the snapshot's two files
        chorus::set_snapshot_write_hook(
            [die, fail_at_step](int64_t step) { die(step, fail_at_step); });
      else if (fail_in_sync)
        to.before_sync = [die, fail_at_step](int64_t step) { die(step, fail_at_step); };
      else if (fail_in_eval)
        to.before_eval = [die, fail_at_step](int64_t step) { die(step, fail_at_step); };
      else if (fail_in_backward)  // the victim's steps run 1, 2, ... until it dies: count them
        model.parameters()[0].register_grad_ready_hook(
            [die, fail_at_step, step = int64_t{0}](chorus::Tensor&) mutable {
              die(++step, fail_at_step);
            });
      else
        to.after_step = [die, fail_at_step](int64_t step) { die(step, fail_at_step); };
    }
    chorus::print_primary(comm,
                          "train_cnn: data {}, train {} test {}, params {}, ranks {}, batch {} per "
                          "rank ({} in all), lr {}, momentum {}, seed {}, threads {}\n",
                          data.name, data.train->size(), data.test->size(),
                          chorus::count_parameters(model), world, batch_size, batch_size * world,
                          lr, momentum, seed, threads);
    if (ddp) {
      const auto& b = ddp->reducer().buckets();
      chorus::print_primary(comm,
                            "train_cnn: ddp over {} ranks, {} gradient bucket(s), device {}\n",
                            world, b.size(), ddp->device().str());
    }
    chorus::Trainer trainer(model, optimizer, loader, data.test.get(), to);
    trainer.run([&](const chorus::EpochStats& e) {
      chorus::print_primary(
          comm,
          "epoch {}: train loss {:.4f}, train acc {:.4f}, {:.0f} images/s, test acc {:.4f} | "
          "{:.2f} s, cpu {:.2f} s{}\n",
          e.epoch, e.train_loss, e.train_acc, e.images_per_s, e.test_acc, e.seconds, e.cpu_seconds,
          ddp ? fmt::format(", grad sync wait {:.2f} s ({:.1f}% of the epoch, rank 0)",
                            e.sync_wait_seconds, 100.0 * e.sync_wait_seconds / e.seconds)
              : std::string());
    });
    if (!elastic_dir.empty() && comm && comm->rank() == 0)
      chorus::announce_finished(elastic_dir);  // a worker still waiting to rejoin leaves
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    chorus::print_primary(comm, "peak memory (max rss) {:.1f} MiB\n",
                          static_cast<double>(ru.ru_maxrss) / 1024.0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_cnn: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
