// CHORUS_HD marks the element helpers that both the CPU kernels and the CUDA kernels use
// (kernels/cpu/half.h, kernels/cpu/reduce_elem.h): `__host__ __device__` under nvcc, nothing
// under a plain C++ compiler. One definition of the arithmetic, so the CPU tests check the
// device's arithmetic too.
#pragma once

#ifdef __CUDACC__
#define CHORUS_HD __host__ __device__
#else
#define CHORUS_HD
#endif
