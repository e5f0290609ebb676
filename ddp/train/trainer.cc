// Trainer: the epoch/step loop and evaluation.
#include "ddp/train/trainer.h"

#include <fmt/format.h>

#include <time.h>

#include <chrono>

#include "ddp/dist/dist_utils.h"
#include "ddp/ops/ops.h"
#include "ddp/tensor/autograd.h"
#include "ddp/train/progress.h"

namespace chorus {
namespace {

// CLOCK_REALTIME, for lines bench/elastic.sh compares with another process's timestamps.
double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// How long a failed step's GPU work may take to end before a roll-back (Reducer::drain).
constexpr double kDrainSeconds = 30;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

Trainer::Trainer(Module& model, Sgd& optimizer, DataLoader& train, const Dataset* test,
                 TrainOptions options)
    : model_(model),
      optimizer_(optimizer),
      train_(train),
      test_(test),
      options_(std::move(options)) {
  global_step_ = options_.resume.global_step;
  if (options_.cuda_graph) {
    if (options_.device.is_cpu())
      throw std::invalid_argument("Trainer: cuda_graph needs a cuda device, got cpu");
    if (options_.recover || options_.grow || options_.leave || options_.joined)
      throw std::invalid_argument(
          "Trainer: cuda_graph with elastic training: a graph keeps the addresses and the world "
          "size of its capture; train without one of them");
    if (options_.comm && options_.comm->size() > 1 && !options_.ddp)
      throw std::invalid_argument(
          "Trainer: cuda_graph with a communicator of several ranks but no DDP: nothing would "
          "keep the ranks' gradients in step");
    // A graph replays the kernels of its device only: work elsewhere (a model split across
    // devices) would run at the capture and never again.
    for (const auto& [name, p] : model_.named_parameters())
      if (p.device() != options_.device)
        throw std::invalid_argument(fmt::format(
            "Trainer: cuda_graph captures the step on {}, but parameter {} is on {} (a graph "
            "replays one device's kernels: train a model split across devices without it)",
            options_.device.str(), name, p.device().str()));
  }
}

// One step through the CUDA graph: the batch copied into the static inputs, then the graph's run
// (eager while warming up, captured once, replayed after); its outputs stay in graphed_.
void Trainer::graphed_step(const Batch& batch) {
  Graphed& g = graphed_;
  // The update's learning rate is a kernel argument: a replay keeps the capture's.
  const float lr = optimizer_.options().lr;
  if (g.lr >= 0 && lr != g.lr)
    throw std::logic_error(fmt::format(
        "Trainer: the learning rate changed from {} to {} after the step was captured as a CUDA "
        "graph, whose update keeps the one it was captured with (train without cuda_graph to "
        "change it)",
        g.lr, lr));
  struct Remember {  // the capture's, once the step's graphs are captured
    Graphed& g;
    float lr;
    ~Remember() {
      if (g.lr < 0 && g.graph && g.graph->captured() && (!g.update || g.update->captured()))
        g.lr = lr;
    }
  } remember{g, lr};
  if (!g.graph) {
    g.batch = static_cast<int64_t>(batch.size());
    g.graph = std::make_unique<StepGraph>(options_.device);
    g.images = Tensor::empty(batch.images.shape(), options_.device);
    g.labels = Labels(g.batch, options_.device);
    g.whole = options_.ddp && !options_.cuda_graph_split &&
              options_.ddp->reducer().capturable(options_.device);
  }
  g.images.copy_from(batch.images);
  g.labels.set(batch.labels, train_.dataset().num_classes());
  DistributedDataParallel* ddp = options_.ddp;
  if (!ddp) {
    g.graph->run([&] {
      optimizer_.zero_grad();
      g.logits = model_.forward(g.images);
      g.loss = cross_entropy(g.logits, g.labels);
      g.loss.backward();
      optimizer_.step();
    });
    return;
  }
  Reducer& reducer = ddp->reducer();
  // DDP: the whole step one graph, whose gradient hooks (run while warming up and capturing)
  // fork the buckets' all-reduces into it and whose finish joins them.
  if (g.whole) {
    if (options_.before_sync) options_.before_sync(global_step_ + 1);
    g.graph->run([&] {
      optimizer_.zero_grad();
      g.logits = ddp->forward(g.images);
      g.loss = cross_entropy(g.logits, g.labels);
      g.loss.backward();
      ddp->finish_gradient_sync();
      optimizer_.step();
    });
    if (options_.after_backward) options_.after_backward();
    return;
  }
  // Split (or a bucket off the device): forward and backward as one graph, whose gradient hooks
  // (run while warming up and capturing, not at replays) divide but launch nothing; then the
  // all-reduces, launched here; then the update as a second graph.
  if (!g.update) g.update = std::make_unique<StepGraph>(options_.device);
  bool ran = false;  // the step itself ran (warm-up or capture), not only a replay
  reducer.set_deferred(true);
  try {
    g.graph->run([&] {
      ran = true;
      optimizer_.zero_grad();
      g.logits = ddp->forward(g.images);
      g.loss = cross_entropy(g.logits, g.labels);
      g.loss.backward();
    });
  } catch (...) {
    reducer.set_deferred(false);
    throw;
  }
  reducer.set_deferred(false);
  if (options_.before_sync) options_.before_sync(global_step_ + 1);
  reducer.sync_deferred(/*replayed=*/!ran);
  if (options_.after_backward) options_.after_backward();
  g.update->run([&] { optimizer_.step(); });
}

void Trainer::save(int64_t epoch, int64_t step_in_epoch) {
  TrainState st;
  st.epoch = epoch;
  st.step_in_epoch = step_in_epoch;
  st.global_step = global_step_;
  st.seed = options_.seed;
  st.world_size = options_.comm ? options_.comm->size() : 1;
  st.batch_size = options_.batch_size;
  st.lr = optimizer_.options().lr;
  save_checkpoint(options_.comm, options_.checkpoint_dir, model_, optimizer_, st);
}

namespace {

// Interval and epoch sums: loss * images, correct predictions, images.
struct Sums {
  double loss = 0, correct = 0, images = 0;
};

Sums global_sums(Communicator* comm, const Sums& mine) {
  if (!comm) return mine;
  std::vector<double> v{mine.loss, mine.correct, mine.images};
  reduce_sum(*comm, v);
  return {v[0], v[1], v[2]};
}

}  // namespace

void Trainer::capture(Snapshot& s, int64_t step, int64_t position, const double* sums,
                      int64_t images) {
  s.step = step;
  s.global_step = global_step_;
  s.position = position;
  std::copy(sums, sums + 6, s.sums);
  s.images = images;
  const std::vector<Tensor> params = model_.parameters();
  s.params.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) s.params[i] = params[i].to_vector();  // any device
  auto& bufs = optimizer_.momentum_buffers();
  s.momenta.clear();
  if (!bufs.empty() && bufs[0].defined()) {
    s.momenta.resize(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) s.momenta[i] = bufs[i].to_vector();
  }
}

void Trainer::restore(const Snapshot& s) {
  const std::vector<Tensor> params = model_.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    params[i].copy_from(Tensor::from(params[i].shape(), s.params[i]));  // any device
  auto& bufs = optimizer_.momentum_buffers();
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (s.momenta.empty()) {
      bufs[i] = Tensor();  // rolled back to before the first step: no momentum yet
      continue;
    }
    if (!bufs[i].defined()) bufs[i] = Tensor::empty(params[i].shape(), params[i].device());
    bufs[i].copy_from(Tensor::from(params[i].shape(), s.momenta[i]));
  }
  global_step_ = s.global_step;
}

void Trainer::share_state(int64_t* epoch, bool newcomer) {
  Communicator& comm = *options_.comm;
  Snapshot& s = cur_;
  std::vector<double> h = {static_cast<double>(*epoch),
                           static_cast<double>(s.step),
                           static_cast<double>(s.global_step),
                           static_cast<double>(s.position),
                           static_cast<double>(optimizer_.options().lr),
                           s.momenta.empty() ? 0.0 : 1.0};
  comm.broadcast(h.data(), h.size(), chorusFloat64, 0);
  *epoch = static_cast<int64_t>(h[0]);
  s.step = static_cast<int64_t>(h[1]);
  s.global_step = static_cast<int64_t>(h[2]);
  s.position = static_cast<int64_t>(h[3]);
  optimizer_.set_lr(static_cast<float>(h[4]));
  if (newcomer) {
    std::fill(s.sums, s.sums + 6, 0.0);
    s.images = 0;
  }
  const std::vector<Tensor> params = model_.parameters();
  s.params.resize(params.size());
  s.momenta.resize(h[5] != 0.0 ? params.size() : 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto n = static_cast<size_t>(params[i].numel());
    s.params[i].resize(n);
    comm.broadcast(s.params[i].data(), n, chorusFloat32, 0);
    if (s.momenta.empty()) continue;
    s.momenta[i].resize(n);
    comm.broadcast(s.momenta[i].data(), n, chorusFloat32, 0);
  }
}

namespace {

// "rank 2 (pid 9, ...) died: its process is gone" -> "its process is gone"; else the message.
std::string death_reason(const std::string& what) {
  auto at = what.rfind("died: ");
  std::string r = at == std::string::npos ? what : what.substr(at + 6);
  return r.size() > 120 ? r.substr(0, 117) + "..." : r;
}

}  // namespace

EpochStats Trainer::run_epoch(int epoch) {
  EpochStats st;
  st.epoch = epoch;
  const bool elastic = options_.recover && options_.sampler;
  bool primary = !options_.comm || options_.comm->rank() == 0;
  model_.train();
  train_.begin_epoch(epoch - 1);
  int64_t steps = train_.batches_per_epoch();
  if (options_.max_steps_per_epoch >= 0 && options_.max_steps_per_epoch < steps)
    steps = options_.max_steps_per_epoch;
  // Resuming inside this epoch: skip the batches already trained on (same order: seed + epoch).
  int64_t first_step = 0;
  if (epoch == options_.resume.epoch) first_step = std::min(options_.resume.step_in_epoch, steps);
  Batch batch;
  for (int64_t i = 0; i < first_step && train_.next(batch); ++i) {
  }
  // Every rank trains on equally many equally sized batches (DistributedSampler pads), so the
  // job's image count is this rank's times the world size, with no collective per step.
  int ranks = options_.comm ? options_.comm->size() : 1;
  ProgressBar bar(options_.out, fmt::format("epoch {}", epoch), steps,
                  options_.progress && primary && options_.log_every <= 0, ranks);
  Sums epoch_sums, interval;
  auto sums = [&](double* a) {
    const double v[6] = {epoch_sums.loss, epoch_sums.correct, epoch_sums.images,
                         interval.loss,   interval.correct,   interval.images};
    std::copy(v, v + 6, a);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto interval_t0 = t0;
  const double c0 = process_cpu_seconds();
  if (options_.ddp) options_.ddp->reducer().reset_stats();
  int64_t step = first_step;
  int64_t since = first_step;   // steps since the sampler's (re)start
  int64_t recovered_from = -1;  // the failed step (or the first after a grow), until it completes
  if (elastic && !join_pending_) {
    double a[6];
    sums(a);
    prev_.step = -1;
    capture(cur_, step, options_.sampler->position_after(since, options_.batch_size), a, st.images);
  }
  // Go on from cur_ over the current communicator (after a shrink or a grow): the rest of the
  // epoch re-divided from cur_'s position.
  auto adopt = [&]() {
    prev_.step = -1;
    restore(cur_);
    if (options_.sample_log) {
      fmt::print(options_.sample_log, "resume {}\n", cur_.global_step);
      std::fflush(options_.sample_log);
    }
    epoch_sums = {cur_.sums[0], cur_.sums[1], cur_.sums[2]};
    interval = {cur_.sums[3], cur_.sums[4], cur_.sums[5]};
    st.images = cur_.images;
    ranks = options_.comm->size();
    primary = options_.comm->rank() == 0;
    options_.sampler->set_epoch(epoch - 1);  // a newcomer's sampler may be at another epoch
    options_.sampler->restart_at(cur_.position, ranks, options_.comm->rank());
    train_.begin_epoch(epoch - 1);
    step = cur_.step;
    since = 0;
    steps = step + train_.batches_per_epoch();
    if (options_.max_steps_per_epoch >= 0) steps = std::min(steps, options_.max_steps_per_epoch);
  };
  // After a failed step (elastic): shrink, roll back to the last step every survivor completed,
  // re-divide the rest of the epoch, go on.
  auto recover = [&](const Error& e) {
    const int old_world = options_.comm->size();
    const int64_t failed_at = global_step_ + 1;
    // On a GPU: the failed step's kernels and waits first end (released by the failure).
    if (options_.ddp) options_.ddp->reducer().drain(kDrainSeconds);
    TrainOptions::Recovered r = options_.recover(e);
    options_.comm = r.comm;
    options_.ddp = r.ddp;
    std::vector<int64_t> agreed{cur_.step};
    r.comm->all_reduce(agreed.data(), agreed.data(), 1, chorusInt64, chorusMin);
    const bool back = cur_.step != agreed[0];
    if ((back ? prev_.step : cur_.step) != agreed[0])
      throw std::runtime_error(fmt::format(
          "elastic: the survivors' last common step is {} of this epoch; this rank holds {} and {}",
          agreed[0], prev_.step, cur_.step));
    if (back) cur_ = prev_;
    adopt();
    optimizer_.set_lr(optimizer_.options().lr * static_cast<float>(ranks) /
                      static_cast<float>(old_world));
    recovered_from = failed_at;
    if (primary) {
      fmt::print(options_.out,
                 "{} died at step {} ({}); continuing with {} rank{} from step {}, lr {:g}\n",
                 r.lost, failed_at, death_reason(e.what()), ranks, ranks > 1 ? "s" : "",
                 cur_.global_step, optimizer_.options().lr);
      std::fflush(options_.out);
    }
  };
  // The communicator changed at a step boundary without a failure (ranks joined, or left on
  // purpose): everyone takes rank 0's state and goes on over the new world.
  auto reshape = [&](const TrainOptions::Recovered& r, const char* what) {
    const int old_world = ranks;
    options_.comm = r.comm;
    options_.ddp = r.ddp;
    optimizer_.set_lr(optimizer_.options().lr * static_cast<float>(r.comm->size()) /
                      static_cast<float>(old_world));
    int64_t e = epoch;
    share_state(&e, /*newcomer=*/false);
    adopt();
    if (primary) {
      fmt::print(options_.out, "{} {} at step {}; continuing with {} ranks, lr {:g}\n", r.lost,
                 what, cur_.global_step, ranks, optimizer_.options().lr);
      std::fflush(options_.out);
    }
    recovered_from = cur_.global_step + 1;
  };
  // Restarted workers wait (rank 0 saw n): grow and go on.
  auto grow = [&](int n) {
    if (primary) {  // bench/elastic.sh times the running ranks' pause from here
      fmt::print(options_.out, "rejoin: {} worker(s) waiting before step {} at {:.6f}\n", n,
                 global_step_ + 1, wall_seconds());
      std::fflush(options_.out);
    }
    reshape(options_.grow(n), "rejoined");
  };
  if (join_pending_) {  // a newcomer: cur_ is what rank 0 sent
    join_pending_ = false;
    adopt();
  }
  // The epoch's end is collective too (global sums, the snapshot, the evaluation): a death
  // there is recovered as one inside a step, and the survivors go through the end again (after
  // any step they rolled back into).
  while (true) {
    try {
      while (step < steps && train_.next(batch)) {
        try {
          if (elastic && options_.leave) {
            if (auto r = options_.leave(global_step_)) {
              reshape(*r, "left");
              continue;
            }
          }
          if (elastic && options_.joiners_waiting) {
            std::vector<int64_t> waiting{primary ? options_.joiners_waiting(global_step_ + 1) : 0};
            options_.comm->broadcast(waiting.data(), 1, chorusInt64, 0);
            if (waiting[0] > 0) {
              grow(static_cast<int>(waiting[0]));
              continue;  // the batch in hand was cut for the old world
            }
          }
          if (options_.sample_log) {  // before the step: a rank may die inside it
            std::string line = fmt::format("try {}", global_step_ + 1);
            for (int64_t i : batch.indices) line += fmt::format(" {}", i);
            fmt::print(options_.sample_log, "{}\n", line);
            std::fflush(options_.sample_log);
          }
          Tensor logits, loss;
          if (options_.cuda_graph &&
              (graphed_.batch == 0 || graphed_.batch == static_cast<int64_t>(batch.size()))) {
            graphed_step(batch);
            logits = graphed_.logits;
            loss = graphed_.loss;
          } else {
            optimizer_.zero_grad();
            const Tensor images =
                options_.device.is_cpu() ? batch.images : batch.images.to(options_.device);
            logits = options_.ddp ? options_.ddp->forward(images) : model_.forward(images);
            loss = cross_entropy(logits, batch.labels);
            const auto b0 = std::chrono::steady_clock::now();
            loss.backward();
            st.backward_seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
            if (options_.before_sync) options_.before_sync(global_step_ + 1);
            if (options_.ddp) options_.ddp->finish_gradient_sync();
            if (options_.after_backward) options_.after_backward();
            optimizer_.step();
          }
          ++global_step_;
          ++step;
          ++since;
          const float l = loss.item();
          if (options_.record_step_losses) st.step_losses.push_back(l);
          const std::vector<int32_t> pred = argmax(logits);
          double correct = 0;
          for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == batch.labels[i];
          const double n = static_cast<double>(batch.size());
          for (Sums* s : {&epoch_sums, &interval}) {
            s->loss += static_cast<double>(l) * n;
            s->correct += correct;
            s->images += n;
          }
          st.images += batch.size();
          if (recovered_from >= 0 && primary) {  // bench/elastic.sh reads this
            fmt::print(options_.out, "recovered: step {} completed at {:.6f}\n", global_step_,
                       wall_seconds());
            std::fflush(options_.out);
          }
          recovered_from = -1;
          if (elastic) {
            std::swap(prev_, cur_);
            double a[6];
            sums(a);
            capture(cur_, step, options_.sampler->position_after(since, options_.batch_size), a,
                    st.images);
          }
          bar.update(step, epoch_sums.loss / epoch_sums.images, st.images * ranks);
          if (options_.log_every > 0 && (step % options_.log_every == 0 || step == steps)) {
            const auto now = std::chrono::steady_clock::now();
            const double secs = std::chrono::duration<double>(now - interval_t0).count();
            Communicator* comm = options_.comm;
            if (options_.per_rank_log && comm)
              fmt::print(options_.out,
                         "rank {} epoch {} step {}/{}: loss {:.4f} acc {:.4f} | {:.0f} images/s "
                         "(this rank)\n",
                         comm->rank(), epoch, step, steps, interval.loss / interval.images,
                         interval.correct / interval.images, interval.images / secs);
            const Sums g = global_sums(comm, interval);
            if (primary)
              fmt::print(
                  options_.out,
                  "epoch {} step {}/{}: loss {:.4f} acc {:.4f} | {:.0f} images/s ({} rank{})\n",
                  epoch, step, steps, g.loss / g.images, g.correct / g.images, g.images / secs,
                  comm ? comm->size() : 1, comm && comm->size() > 1 ? "s" : "");
            std::fflush(options_.out);
            interval = {};
            interval_t0 = now;
          }
          if (options_.after_step) options_.after_step(global_step_);
          if (!options_.checkpoint_dir.empty() && options_.checkpoint_every > 0 &&
              global_step_ % options_.checkpoint_every == 0 && step < steps)
            save(epoch, step);
        } catch (const Error& e) {
          if (!elastic) throw;
          recover(e);
        }
      }
      if (elastic && options_.leave) {  // the reference run of a death at the epoch's end
        if (auto r = options_.leave(global_step_)) reshape(*r, "left");
      }
      Communicator* comm = options_.comm;
      st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.cpu_seconds = process_cpu_seconds() - c0;
      st.steps = steps - first_step;
      bar.finish();
      train_.end_epoch();  // stops the prefetch thread when steps were capped
      if (options_.ddp) st.sync_wait_seconds = options_.ddp->reducer().stats().wait_seconds;
      const Sums g = global_sums(comm, epoch_sums);
      st.images = static_cast<int64_t>(g.images);
      st.train_loss = g.images > 0 ? g.loss / g.images : 0.0;
      st.train_acc = g.images > 0 ? g.correct / g.images : 0.0;
      st.images_per_s = st.seconds > 0 ? g.images / st.seconds : 0.0;
      if (!options_.checkpoint_dir.empty()) save(epoch + 1, 0);
      if (options_.before_eval) options_.before_eval(global_step_);
      if (test_)
        st.test_acc = comm ? evaluate_distributed(*comm, model_, *test_, options_.eval_batch_size)
                           : evaluate(model_, *test_, options_.eval_batch_size);
      return st;
    } catch (const Error& e) {
      if (!elastic) throw;
      recover(e);
    }
  }
}

std::vector<EpochStats> Trainer::run(const std::function<void(const EpochStats&)>& on_epoch) {
  std::vector<EpochStats> all;
  int64_t first = std::max<int64_t>(1, options_.resume.epoch);
  if (options_.joined) {  // a newcomer: the members' state, and the epoch they are in
    share_state(&first, /*newcomer=*/true);
    join_pending_ = true;
  }
  for (int e = static_cast<int>(first); e <= options_.epochs; ++e) {
    all.push_back(run_epoch(e));
    if (on_epoch) on_epoch(all.back());
  }
  return all;
}

namespace {

int64_t count_correct(Module& model, const Dataset& data, int64_t begin, int64_t end,
                      int64_t batch_size) {
  NoGradGuard no_grad;
  const auto params = model.parameters();  // the images go where the model is
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  const bool was_training = model.is_training();
  model.eval();
  const Shape s = data.sample_shape();
  int64_t correct = 0;
  for (int64_t first = begin; first < end; first += batch_size) {
    const int64_t count = std::min(batch_size, end - first);
    Tensor x = Tensor::empty(Shape{count, s[0], s[1], s[2]});
    std::vector<int32_t> labels(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      labels[static_cast<size_t>(i)] = data.get(first + i, x.data() + i * s.numel());
    const std::vector<int32_t> pred = argmax(model.forward(device.is_cpu() ? x : x.to(device)));
    for (int64_t i = 0; i < count; ++i)
      correct += pred[static_cast<size_t>(i)] == labels[static_cast<size_t>(i)];
  }
  model.train(was_training);
  return correct;
}

}  // namespace

double evaluate(Module& model, const Dataset& data, int64_t batch_size) {
  const int64_t correct = count_correct(model, data, 0, data.size(), batch_size);
  return data.size() ? static_cast<double>(correct) / static_cast<double>(data.size()) : 0.0;
}

double evaluate_distributed(Communicator& comm, Module& model, const Dataset& data,
                            int64_t batch_size) {
  const int64_t n = data.size(), r = comm.rank(), w = comm.size();
  std::vector<double> correct{
      static_cast<double>(count_correct(model, data, n * r / w, n * (r + 1) / w, batch_size))};
  reduce_sum(comm, correct);
  return n ? correct[0] / static_cast<double>(n) : 0.0;
}

}  // namespace chorus
