#include "emulated_gpu.h"

#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "../collectives/fake_gpu.h"
#include "ddp/ops/kernel_table.h"

namespace chorus::test {
namespace {

// The capture under way (the kernels it records), or null.
std::vector<std::function<void()>>* g_tape = nullptr;

// Cross-stream capture, as CUDA's: the communication stream joins the capture when it waits for
// an event recorded in it, and stays in it until the capture ends; from there the communicator's
// device calls on it are recorded by the device path's emulation (fake_capture_begin), in pieces
// that end at the stream's next event or wait. A piece's replay sits in the tape where it began
// (after the kernels that wrote its input), so a replay runs everything in an order the graph
// allows. The capture ends joined only when the capturing stream waited for the communication
// stream's last event and nothing went on that stream after it (else CUDA's
// cudaErrorStreamCaptureUnjoined).
struct Piece {
  void* graph = nullptr;
  Piece() = default;
  Piece(const Piece&) = delete;
  Piece& operator=(const Piece&) = delete;
  ~Piece() {
    if (graph) fake_graph_free(graph);
  }
};
std::shared_ptr<Piece> g_open;      // the communication stream's piece being recorded, or null
std::set<void*> g_captured_events;  // events whose latest record is in the capture
void* g_comm_last = nullptr;        // the communication stream's last event in the capture
bool g_joined = false;              // the capturing stream waited for it

// The communication stream's piece so far ends; a new one begins at this point of the tape.
void next_piece(std::vector<std::function<void()>>& tape) {
  if (g_open) g_open->graph = fake_capture_end(EmulatedGpu::kCommStream);
  auto piece = std::make_shared<Piece>();
  tape.push_back([piece] {
    if (fake_graph_launch(piece->graph, EmulatedGpu::kCommStream) != 0)
      throw std::runtime_error("emulated gpu: a replay's communicator calls failed");
  });
  fake_capture_begin(EmulatedGpu::kCommStream);
  g_open = piece;
}

[[noreturn]] void not_in_capture(const char* what, const char* why = "it would wait for the GPU") {
  throw std::runtime_error(std::string("emulated gpu: ") + what + " inside a captured step (" +
                           why + ")");
}
constexpr const char* kStreams = "DDP makes its streams at construction";

// Kernel-table entry M of the cpu's table, recorded while capturing.
template <typename F>
struct Recorded;
template <typename R, typename... A>
struct Recorded<R (*)(A...)> {
  template <auto M>
  static R call(A... a) {
    const auto f = kernel_table_for(Device::cpu()).*M;
    if (!g_tape) return f(a...);
    if constexpr (std::is_void_v<R>)
      g_tape->push_back([f, a...] { f(a...); });  // by value: shapes, pointers, scalars
    else
      not_in_capture("a kernel that returns a host value");
  }
};
template <auto M>
constexpr auto recorded() {
  using F = std::remove_cvref_t<decltype(std::declval<const KernelTable&>().*M)>;
  return &Recorded<F>::template call<M>;
}

const KernelTable& recording_table() {
  static const KernelTable t = [] {
    KernelTable k{};
    k.gemm = recorded<&KernelTable::gemm>();
    k.conv2d_forward = recorded<&KernelTable::conv2d_forward>();
    k.conv2d_backward = recorded<&KernelTable::conv2d_backward>();
    k.max_pool2d_forward = recorded<&KernelTable::max_pool2d_forward>();
    k.max_pool2d_backward = recorded<&KernelTable::max_pool2d_backward>();
    k.relu_forward = recorded<&KernelTable::relu_forward>();
    k.relu_backward = recorded<&KernelTable::relu_backward>();
    k.add = recorded<&KernelTable::add>();
    k.mul = recorded<&KernelTable::mul>();
    k.scale = recorded<&KernelTable::scale>();
    k.div_scalar = recorded<&KernelTable::div_scalar>();
    k.fill = recorded<&KernelTable::fill>();
    k.sum = recorded<&KernelTable::sum>();
    k.add_row_bias = recorded<&KernelTable::add_row_bias>();
    k.sum_rows = recorded<&KernelTable::sum_rows>();
    k.log_softmax_forward = recorded<&KernelTable::log_softmax_forward>();
    k.log_softmax_backward = recorded<&KernelTable::log_softmax_backward>();
    k.nll_forward = [](int rows, int cols, const float* logp, const int32_t* labels, bool on_device,
                       float divisor, float* y) {
      if (g_tape && !on_device) not_in_capture("NLL labels from host memory");
      recorded<&KernelTable::nll_forward>()(rows, cols, logp, labels, on_device, divisor, y);
    };
    k.nll_backward = [](int rows, int cols, const int32_t* labels, bool on_device, const float* dy,
                        float scale, float* dlogp) {
      if (g_tape && !on_device) not_in_capture("NLL labels from host memory");
      recorded<&KernelTable::nll_backward>()(rows, cols, labels, on_device, dy, scale, dlogp);
    };
    k.argmax_rows = [](int rows, int cols, const float* x, int32_t* out) {
      if (g_tape) not_in_capture("argmax (a host output)");
      kernel_table_for(Device::cpu()).argmax_rows(rows, cols, x, out);
    };
    k.sgd_update = recorded<&KernelTable::sgd_update>();
    return k;
  }();
  return t;
}

std::string event_name(void* event) {
  return "e" + std::to_string(reinterpret_cast<uintptr_t>(event));
}

std::string stream_name(void* s) {
  return s == nullptr ? "default" : s == EmulatedGpu::kCommStream ? "comm" : "another stream";
}

}  // namespace

void* EmulatedGpu::alloc(Device, size_t bytes) {
  return fake_device_alloc(bytes);
}

void EmulatedGpu::free(Device, void* p) {
  fake_device_free(p);
}

void EmulatedGpu::copy(void* dst, Device, const void* src, Device, size_t bytes) {
  if (g_tape) not_in_capture("a copy");
  std::memmove(dst, src, bytes);
}

void EmulatedGpu::add(Device, long n, const float* a, const float* b, float* y) {
  auto run = [=] {
    for (long i = 0; i < n; ++i) y[i] = a[i] + b[i];
  };
  g_tape ? g_tape->push_back(run) : run();
}

void EmulatedGpu::fill(Device, long n, float value, float* y) {
  auto run = [=] {
    for (long i = 0; i < n; ++i) y[i] = value;
  };
  g_tape ? g_tape->push_back(run) : run();
}

void EmulatedGpu::capture_begin(Device) {
  if (g_tape) throw std::runtime_error("emulated gpu: a capture is under way already");
  g_tape = new std::vector<std::function<void()>>();
  g_comm_last = nullptr;
  g_joined = false;
}

void* EmulatedGpu::capture_end(Device) {
  if (!g_tape) throw std::runtime_error("emulated gpu: no capture under way");
  std::unique_ptr<std::vector<std::function<void()>>> graph(g_tape);
  g_tape = nullptr;
  g_captured_events.clear();
  if (g_open) {
    g_open->graph = fake_capture_end(kCommStream);
    const bool after = fake_graph_ops(g_open->graph) > 0;  // work after its last event
    g_open.reset();
    if (!g_joined || after)
      throw std::runtime_error(
          "emulated gpu: the communication stream joined the capture and was not waited for by "
          "the capturing stream again (CUDA: cudaErrorStreamCaptureUnjoined)");
  }
  captured_kernels = graph->size();
  return graph.release();
}

void EmulatedGpu::graph_launch(Device, void* graph) {
  if (g_tape) not_in_capture("a graph launch");
  ++graph_launches;
  for (auto& kernel : *static_cast<std::vector<std::function<void()>>*>(graph)) kernel();
}

void EmulatedGpu::graph_destroy(Device, void* graph) {
  delete static_cast<std::vector<std::function<void()>>*>(graph);
}

void* EmulatedGpu::new_stream(Device) {
  if (g_tape) not_in_capture("a new stream", kStreams);
  trace.push_back("new comm");
  return kCommStream;
}

void EmulatedGpu::record_event(Device, void* stream, void** event) {
  if (*event == nullptr) *event = reinterpret_cast<void*>(++events_);
  if (!g_tape) {
    g_captured_events.erase(*event);
  } else {
    if (stream == kCommStream) {
      if (!g_open)
        not_in_capture("an event on the communication stream before it joined the capture",
                       "it would order nothing the graph does");
      next_piece(*g_tape);  // its work so far ends at the event; it stays in the capture
      g_comm_last = *event;
      g_joined = false;
    }
    g_captured_events.insert(*event);
  }
  trace.push_back("record " + event_name(*event) + " on " + stream_name(stream) +
                  (g_tape ? " (captured)" : ""));
}

void EmulatedGpu::wait_event(Device, void* stream, void* event) {
  if (g_tape) {
    if (!g_captured_events.count(event))
      not_in_capture("a wait for an event recorded outside the capture",
                     "CUDA: cudaErrorStreamCaptureIsolation");
    if (stream == kCommStream) next_piece(*g_tape);  // a fork: its calls from here after it
    if (stream == nullptr && event == g_comm_last) g_joined = true;
  }
  trace.push_back("wait " + stream_name(stream) + " for " + event_name(event) +
                  (g_tape ? " (captured)" : ""));
}

bool EmulatedGpu::drained(Device, const std::vector<void*>&, double) {
  return !never_drains;
}

EmulatedGpu& emulated_gpu() {
  static EmulatedGpu gpu;
  return gpu;
}

void use_emulated_gpu() {
  install_fake_gpu();
  set_cuda_backend_for_test(&emulated_gpu());
  set_cuda_kernel_table_for_test(&recording_table());  // the cpu's, recorded while capturing
}

}  // namespace chorus::test
