// DistributedDataParallel and its Reducer (buckets, gradient-ready hooks, ordered async launch).
#include "ddp/dist/distributed.h"

#include "ddp/ops/kernel_table.h"
#include "ddp/ops/ops.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/env.h"
#include "ddp/tensor/autograd.h"
#include "ddp/tensor/device_cache.h"

namespace chorus {

// ---- devices ------------------------------------------------------------------------------

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(n));
  comm.all_gather(&len, lens.data(), 1, chorusInt64);
  const int64_t width = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<char> send(static_cast<size_t>(width), '\0'), recv(static_cast<size_t>(width * n));
  std::memcpy(send.data(), mine.data(), mine.size());
  comm.all_gather(send.data(), recv.data(), static_cast<size_t>(width), chorusUint8);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(recv.data() + r * width, static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

namespace {

// CHORUS_ALLOW_SHARED_GPU=1, the communicator's override (collectives/comm.cc), lets ranks of a
// host share one GPU here too.
bool shared_gpu_allowed() {
  const char* v = std::getenv("CHORUS_ALLOW_SHARED_GPU");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace

void check_devices(Communicator& comm, const Device& device) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const auto all = all_gather_strings(comm, std::string(host) + "\n" + device.str());
  for (size_t a = 0; a < all.size(); ++a) {
    const auto [ha, da] =
        std::pair(all[a].substr(0, all[a].find('\n')), all[a].substr(all[a].find('\n') + 1));
    if (da == "cpu") continue;
    for (size_t b = a + 1; b < all.size(); ++b) {
      if (all[b] != all[a] || shared_gpu_allowed()) continue;
      throw std::invalid_argument(fmt::format(
          "ddp: ranks {} and {} on host {} were both given device {}; each process needs its own "
          "device: "
          "pass --device cuda (maps rank to cuda:$LOCAL_RANK) or --device cuda:$LOCAL_RANK "
          "(or set CHORUS_ALLOW_SHARED_GPU=1 to share it, slower)",
          a, b, ha, da));
    }
  }
}

// ---- parameters across ranks --------------------------------------------------------------

namespace {

std::string describe(const std::vector<NamedTensor>& params) {
  std::string s;
  for (const auto& [name, t] : params) s += name + " " + t.shape().str() + "\n";
  return s;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(s.substr(start, nl - start));
  return out;
}

}  // namespace

void verify_parameters_across_ranks(Communicator& comm, const std::vector<NamedTensor>& params) {
  const auto all = all_gather_strings(comm, describe(params));
  const auto ref = lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto other = lines(all[r]);
    for (size_t i = 0; i < std::max(ref.size(), other.size()); ++i) {
      const std::string a = i < ref.size() ? ref[i] : "nothing";
      const std::string b = i < other.size() ? other[i] : "nothing";
      if (a == b) continue;
      throw std::invalid_argument(fmt::format(
          "ddp: the model differs across ranks at parameter #{}: rank 0 has {}, rank {} has {} "
          "(every rank must build the same model)",
          i, a, r, b));
    }
  }
}

// The device every tensor of `params` is on; throws naming two that differ.
Device common_device(const std::vector<NamedTensor>& params, const char* what) {
  if (params.empty()) return Device::cpu();
  const Device d = params.front().second.device();
  for (const auto& [name, t] : params)
    if (t.device() != d)
      throw std::invalid_argument(fmt::format(
          "ddp: {}: {} is on {} but {} is on {}: one device per process (move the module with "
          ".to())",
          what, params.front().first, d.str(), name, t.device().str()));
  return d;
}

void broadcast_parameters(Communicator& comm, const std::vector<NamedTensor>& params, int root) {
  // One flat buffer per device, in the order the devices first appear (the same on every rank:
  // the modules match), broadcast there (host memory, or a device broadcast: CUDA IPC or staged).
  std::vector<Device> devices;
  for (const auto& [name, t] : params)
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  if (devices.empty()) devices.push_back(Device::cpu());
  for (const Device d : devices) {
    int64_t total = 0;
    for (const auto& [name, t] : params)
      if (t.device() == d) total += t.numel();
    Tensor flat = Tensor::empty(Shape{total}, d);
    int64_t off = 0;
    for (const auto& [name, t] : params)
      if (t.device() == d) {
        Tensor::alias(flat, off, t.shape()).copy_from(t);
        off += t.numel();
      }
    comm.broadcast(flat.data(), static_cast<size_t>(total), chorusFloat32, root);
    off = 0;
    for (const auto& [name, t] : params)
      if (t.device() == d) {
        t.copy_from(Tensor::alias(flat, off, t.shape()));
        off += t.numel();
      }
  }
}

// ---- Reducer ------------------------------------------------------------------------------

Reducer::Reducer(Communicator& comm, std::vector<NamedTensor> params, ReducerOptions options)
    : comm_(comm), options_(options), world_(static_cast<float>(comm.size())) {
  if (options_.first_bucket_bytes == 0 || options_.bucket_cap_bytes == 0)
    throw std::invalid_argument("ddp: bucket sizes must be > 0 bytes");
  // Reverse registration order: the last layer's gradients are ready first.
  std::vector<std::vector<int>> groups;
  size_t bytes = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    auto& [name, t] = params[static_cast<size_t>(i)];
    if (!t.requires_grad()) continue;
    // A bucket is one flat buffer: a parameter on another device starts a new one.
    const bool other_device =
        !groups.empty() &&
        slots_[static_cast<size_t>(groups.back().front())].param.device() != t.device();
    if (groups.empty() || other_device ||
        bytes >= (groups.size() == 1 ? options_.first_bucket_bytes : options_.bucket_cap_bytes)) {
      groups.emplace_back();
      bytes = 0;
    }
    slots_.push_back({name, t, static_cast<int>(groups.size()) - 1, 0});
    groups.back().push_back(static_cast<int>(slots_.size()) - 1);
    bytes += sizeof(float) * static_cast<size_t>(t.numel());
  }
  buckets_.resize(groups.size());
  info_.resize(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    int64_t n = 0;
    for (int s : groups[b]) {
      slots_[static_cast<size_t>(s)].offset = n;
      n += slots_[static_cast<size_t>(s)].param.numel();
      info_[b].params.push_back(slots_[static_cast<size_t>(s)].name);
    }
    info_[b].numel = n;
    buckets_[b].flat =
        Tensor::zeros(Shape{n}, slots_[static_cast<size_t>(groups[b][0])].param.device());
    buckets_[b].slots = groups[b];
    const Device d = buckets_[b].flat.device();
    if (!d.is_cpu()) {
      buckets_[b].on_gpu = true;
      CommStream& cs = comm_streams_[d.index];
      if (cs.stream == nullptr) cs.stream = cuda_backend().new_stream(d);
    }
  }
  // Gradients become views into the buckets (keeping any values already there).
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    Tensor view = Tensor::alias(buckets_[static_cast<size_t>(slot.bucket)].flat, slot.offset,
                                slot.param.shape());
    if (slot.param.grad().defined()) view.copy_from(slot.param.grad());
    slot.param.set_grad(view);
    // The hook outlives the Reducer on the parameter: it does nothing once the Reducer is gone.
    slot.param.register_grad_ready_hook([this, s, alive = std::weak_ptr<char>(alive_)](Tensor&) {
      if (!alive.expired()) on_grad_ready(static_cast<int>(s));
    });
  }
  ready_.assign(slots_.size(), 0);
}

const std::vector<BucketInfo>& Reducer::buckets() const {
  return info_;
}

void Reducer::prepare_for_backward() {
  if (armed_) {
    // The previous synchronised backward never reached finish(): name what was missing.
    finish();
  }
  armed_ = true;
  next_launch_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.slots.size());
    b.launched = false;
  }
}

void Reducer::on_grad_ready(int s) {
  if (!armed_) return;  // no_sync (or a backward outside DDP's forward): accumulate only
  Slot& slot = slots_[static_cast<size_t>(s)];
  if (ready_[static_cast<size_t>(s)])
    throw std::logic_error(
        fmt::format("ddp: gradient of {} became ready twice in one backward", slot.name));
  ready_[static_cast<size_t>(s)] = 1;
  Bucket& bucket = buckets_[static_cast<size_t>(slot.bucket)];
  Tensor view = Tensor::alias(bucket.flat, slot.offset, slot.param.shape());
  const Tensor& g = slot.param.grad();
  float* dst = view.data();
  const int64_t n = view.numel();
  check_same_device("ddp gradient", {{"the bucket", &view}, {slot.name.c_str(), &g}});
  const KernelTable& kt = kernel_table_for(view.device());
  if (g.data() != dst) {  // the gradient was replaced (e.g. zero_grad(set_to_none)): copy it in
    kt.div_scalar(n, g.data(), world_, dst);
    slot.param.set_grad(view);
  } else {
    kt.div_scalar(n, dst, world_, dst);
  }
  if (--bucket.pending == 0 && !deferred_) launch_ready_buckets();
}

void Reducer::sync_deferred(bool replayed) {
  if (replayed) {
    if (!complete_deferred_)
      throw std::logic_error(
          "ddp: sync_deferred(replayed) before any deferred backward finished with every "
          "gradient (capture the step before replaying it)");
    if (armed_)
      throw std::logic_error(
          "ddp: sync_deferred(replayed) after a forward through DDP: that backward ran eagerly");
    armed_ = true;
    next_launch_ = 0;
    std::fill(ready_.begin(), ready_.end(), 1);
    for (Bucket& b : buckets_) {
      b.pending = 0;
      b.launched = false;
    }
  }
  if (!armed_) return;  // no forward through DDP since the last sync (as finish())
  launch_ready_buckets();
  finish();
  complete_deferred_ = true;
}

bool Reducer::capturable(const Device& device) const {
  for (const Bucket& b : buckets_)
    if (b.flat.device() != device) return false;
  return true;  // device collectives are captured over CUDA IPC and staged alike
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         buckets_[static_cast<size_t>(next_launch_)].pending == 0) {
    Bucket& b = buckets_[static_cast<size_t>(next_launch_)];
    if (b.on_gpu)
      launch_on_gpu(b);
    else
      b.work = comm_.iall_reduce(b.flat.data(), b.flat.data(), static_cast<size_t>(b.flat.numel()),
                                 chorusFloat32, chorusSum);
    b.launched = true;
    ++next_launch_;
  }
}

void Reducer::launch_on_gpu(Bucket& b) {
  const Device d = b.flat.device();
  DeviceBackend& gpu = cuda_backend();
  CommStream& cs = comm_streams_.at(d.index);
  gpu.record_event(d, nullptr, &b.ready);  // behind the kernels that wrote its gradients
  gpu.wait_event(d, cs.stream, b.ready);
  comm_.all_reduce(b.flat.data(), b.flat.data(), static_cast<size_t>(b.flat.numel()), chorusFloat32,
                   chorusSum, cs.stream);
}

void Reducer::join_comm_streams() {
  DeviceBackend& gpu = cuda_backend();
  for (auto& [index, cs] : comm_streams_) {
    gpu.record_event(Device::cuda(index), cs.stream, &cs.done);
    gpu.wait_event(Device::cuda(index), nullptr, cs.done);
  }
}

void Reducer::drain(double seconds) {
  for (auto& [index, cs] : comm_streams_)
    if (!cuda_backend().drained(Device::cuda(index), {nullptr, cs.stream}, seconds))
      throw std::runtime_error(fmt::format(
          "ddp: the failed step's GPU work on cuda:{} did not end within {:g} s (a stream still "
          "waits for a signal from a rank that failed): cannot roll back",
          index, seconds));
}

bool Reducer::bucket_done(int i) {
  Bucket& b = buckets_.at(static_cast<size_t>(i));
  return b.launched && (b.on_gpu || b.work.test());  // a GPU bucket: enqueued
}

void Reducer::finish() {
  if (!armed_) return;
  armed_ = false;
  if (next_launch_ < static_cast<int>(buckets_.size())) {
    std::string missing;
    int count = 0;
    for (size_t s = 0; s < slots_.size(); ++s)
      if (!ready_[s]) {
        missing += (count++ ? ", " : "") + slots_[s].name;
      }
    // Drain what was launched so the communicator stays usable for the error path.
    for (int i = 0; i < next_launch_; ++i)
      if (!buckets_[static_cast<size_t>(i)].on_gpu) buckets_[static_cast<size_t>(i)].work.wait();
    join_comm_streams();
    throw std::runtime_error(
        fmt::format("ddp: {} parameter(s) received no gradient in this backward: {}. Every "
                    "parameter must take part in "
                    "the loss on every rank (or was backward not called after forward?)",
                    count, missing));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_)
    if (!b.on_gpu) b.work.wait();
  join_comm_streams();
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.syncs;
}

// ---- DistributedDataParallel --------------------------------------------------------------

int env_local_rank() {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    const std::optional<std::string> text = env_get(name);
    if (!text) continue;
    int value = -1;
    const char* end = text->data() + text->size();
    const auto [stop, err] = std::from_chars(text->data(), end, value);
    if (err != std::errc() || stop != end || value < 0)
      throw std::invalid_argument(fmt::format(
          "ddp: env {}='{}' is not a local rank (expected an integer >= 0)", name, *text));
    return value;
  }
  return 0;
}

namespace {

Device first_device(Module& module) {
  const auto params = module.parameters();
  return params.empty() ? Device::cpu() : params.front().device();
}

// Runs the construction-time checks before the Reducer member is built.
std::vector<NamedTensor> checked_parameters(Module& module, Communicator& comm,
                                            const DdpOptions& options, const Device& device) {
  auto params = module.named_parameters();
  if (options.device.empty()) {  // split across devices: each bucket on its own
    verify_parameters_across_ranks(comm, params);
    if (options.broadcast_parameters) broadcast_parameters(comm, params, 0);
    return params;
  }
  check_devices(comm, device);
  if (const Device on = common_device(params, "parameters"); on != device)
    throw std::invalid_argument(fmt::format(
        "ddp: the module's parameters are on {} but the device given is {} (move the module "
        "with .to({}) first, as in PyTorch)",
        on.str(), device.str(), device.str()));
  verify_parameters_across_ranks(comm, params);
  if (options.broadcast_parameters) broadcast_parameters(comm, params, 0);
  return params;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Module& module, Communicator& comm,
                                                 DdpOptions options)
    : module_(module),
      comm_(comm),
      device_(options.device.empty() ? first_device(module)
                                     : Device::parse(options.device, env_local_rank())),
      one_device_(!options.device.empty()),
      reducer_(comm, checked_parameters(module, comm, options, device_), options.reducer) {}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (sync_ && module_.is_training() && grad_mode_enabled()) reducer_.prepare_for_backward();
  // Given one device, the input goes there first (as PyTorch's DDP with device_ids does); a
  // module split across devices moves its activations itself.
  return module_.forward(one_device_ ? to_device(x, device_) : x);
}

}  // namespace chorus
