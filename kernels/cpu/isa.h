// Which instruction-set build of the CPU kernels runs. The library is compiled for baseline x86-64;
// the hot kernels (reductions, streaming copy, conv, pool, elementwise, the fallback GEMM) are
// also compiled for AVX2 and AVX-512 (kernels/cpu/isa/), and one of the three builds is chosen at
// run time from CPUID, or forced with CHORUS_CPU_ISA=scalar|avx2|avx512.
//
// Every build gives the same bits: the per-ISA code is the same C++ (or intrinsics written to
// the scalar semantics), built without floating-point contraction (no FMA fusing) and without
// reassociation, so vectorising only changes how many independent elements run at once. The
// tests compare every build the CPU has with the scalar one bit for bit (tests/kernels).
//
// Threading: the choice is one atomic pointer. Kernel calls may run on any thread while it
// changes; a call already under way finishes with the build it started with.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace chorus::kernels {

// Ordered: a CPU that runs one runs every lower one.
//   kScalar  baseline x86-64 (SSE2: whatever the compiler vectorises for any x86-64 CPU)
//   kAvx2    AVX2 + F16C (Haswell, Zen 1 and later)
//   kAvx512  AVX-512 F, BW, DQ, VL (Skylake-SP, Ice Lake, Zen 4 and later)
enum class Isa : int { kScalar, kAvx2, kAvx512 };
inline constexpr int kNumIsas = 3;

// "scalar" "avx2" "avx512"; parse_isa takes those names, nullopt for anything else.
const char* isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view s);

// The CPU and the operating system support this build (CPUID plus the OS's saved register state).
// Always true for kScalar; false for the others off x86-64 or where they were not compiled.
bool cpu_supports(Isa isa);
// The best build this CPU runs.
Isa best_isa();
// "scalar, avx2": the builds this CPU runs, lowest first.
std::string supported_isas();

// Settles the build from CHORUS_CPU_ISA (unset or "auto": best_isa()). Idempotent; the first
// call decides. Errors (kInvalidArgument) name the variable, its value and what this CPU runs.
// Entry points that can report errors (communicator creation) call it; a kernel called before
// anyone did settles it itself, and aborts with that message when CHORUS_CPU_ISA is bad, since
// running another build than the one asked for would hide what the user meant to test.
Status init_isa();
// The build in use (settling it first if needed, see init_isa).
Isa active_isa();
// Switches to another build (tests, benchmarks). kInvalidArgument if this CPU lacks it.
Status set_isa(Isa isa);

}  // namespace chorus::kernels
