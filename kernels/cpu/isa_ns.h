// The inline namespace that keeps apart the header-only helpers (half.h, reduce_elem.h) of each
// instruction-set build of the kernels. kernels/cpu/isa/ is compiled once per build with
// -DCHORUS_ISA_NS=avx2 (etc.); without it (everywhere else) the helpers are "helpers_generic".
// Inline functions from one header compiled with different -m flags would otherwise share one
// symbol, and the linker would keep an arbitrary copy of it (possibly one with AVX-512 code).
#pragma once

#define CHORUS_ISA_CAT_INNER_(a, b) a##b
#define CHORUS_ISA_CAT_(a, b) CHORUS_ISA_CAT_INNER_(a, b)
#ifdef CHORUS_ISA_NS
#define CHORUS_HELPERS_NS CHORUS_ISA_CAT_(helpers_, CHORUS_ISA_NS)
#else
#define CHORUS_HELPERS_NS helpers_generic
#endif
