// CPUID detection and the choice of the kernel build (isa.h); the active table (isa/table.h).
#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#if CHORUS_KERNELS_X86_ISAS
#include <cpuid.h>
#endif

#include "common/env.h"
#include "common/log.h"
#include "kernels/cpu/isa/table.h"

namespace chorus::kernels {
namespace {

constexpr const char* kIsaNames[kNumIsas] = {"scalar", "avx2", "avx512"};

const CpuKernels* table_for(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return &scalar::kCpuKernels;
#if CHORUS_KERNELS_X86_ISAS
    case Isa::kAvx2:
      return &avx2::kCpuKernels;
    case Isa::kAvx512:
      return &avx512::kCpuKernels;
#endif
    default:
      return nullptr;
  }
}

#if CHORUS_KERNELS_X86_ISAS
// CPUID.1:ECX.F16C (clang 14's __builtin_cpu_supports has no "f16c"). It uses the YMM state
// that the AVX2 check already requires the OS to save.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

std::atomic<const CpuKernels*> g_active{nullptr};
std::once_flag g_init_once;
Status g_init_status;

// Reads CHORUS_CPU_ISA; installs its table unless set_isa() already chose one.
Status settle_from_env() {
  Isa want = best_isa();
  if (auto v = env_get("CHORUS_CPU_ISA"); v && *v != "auto") {
    auto isa = parse_isa(*v);
    if (!isa)
      return make_error(Code::kInvalidArgument,
                        "CHORUS_CPU_ISA='{}': expected scalar, avx2, avx512 or auto", *v);
    if (!cpu_supports(*isa))
      return make_error(Code::kInvalidArgument,
                        "CHORUS_CPU_ISA={}: this cpu cannot run the {} kernels (it runs {})", *v,
                        *v, supported_isas());
    want = *isa;
  }
  const CpuKernels* none = nullptr;
  g_active.compare_exchange_strong(none, table_for(want), std::memory_order_acq_rel);
  log_info("kernels: {} build (this cpu runs {})", isa_name(Isa(g_active.load()->isa)),
           supported_isas());
  return Status::ok();
}

}  // namespace

const char* isa_name(Isa isa) {
  if (unsigned(isa) >= unsigned(kNumIsas)) return "?";
  return kIsaNames[int(isa)];
}

std::optional<Isa> parse_isa(std::string_view s) {
  for (int i = 0; i < kNumIsas; i++)
    if (s == kIsaNames[i]) return Isa(i);
  return std::nullopt;
}

bool cpu_supports(Isa isa) {
  if (isa == Isa::kScalar) return true;
#if CHORUS_KERNELS_X86_ISAS
  // libgcc's (and compiler-rt's) CPU model also checks with XGETBV that the OS saves the YMM and
  // ZMM/opmask state, so a feature reported here is usable.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && has_f16c();
  if (isa == Isa::kAvx2) return avx2;
  if (isa == Isa::kAvx512)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return false;
}

Isa best_isa() {
  for (int i = kNumIsas - 1; i > 0; i--)
    if (cpu_supports(Isa(i))) return Isa(i);
  return Isa::kScalar;
}

std::string supported_isas() {
  std::string s = kIsaNames[0];
  for (int i = 1; i < kNumIsas; i++)
    if (cpu_supports(Isa(i))) s = s + ", " + kIsaNames[i];
  return s;
}

Status init_isa() {
  std::call_once(g_init_once, [] { g_init_status = settle_from_env(); });
  return g_init_status;
}

Isa active_isa() {
  return Isa(cpu_kernels().isa);
}

Status set_isa(Isa isa) {
  if (unsigned(isa) >= unsigned(kNumIsas))
    return make_error(Code::kInvalidArgument, "set_isa: unknown instruction set {}", int(isa));
  if (!cpu_supports(isa))
    return make_error(Code::kInvalidArgument,
                      "set_isa: this cpu cannot run the {} kernels (it runs {})", isa_name(isa),
                      supported_isas());
  g_active.store(table_for(isa), std::memory_order_release);
  return Status::ok();
}

const CpuKernels& settle_cpu_kernels() {
  Status s = init_isa();
  if (!s.is_ok()) {
    std::fprintf(stderr, "chorus: %s\n", s.message().c_str());
    std::abort();
  }
  return *g_active.load(std::memory_order_acquire);
}

const CpuKernels& cpu_kernels() {
  const CpuKernels* t = g_active.load(std::memory_order_acquire);
  if (t != nullptr) [[likely]]
    return *t;
  return settle_cpu_kernels();
}

}  // namespace chorus::kernels
