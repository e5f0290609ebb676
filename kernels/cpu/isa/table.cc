// This instruction-set build's table of entry points (isa/table.h).
#include "kernels/cpu/isa/entries.h"

namespace chorus::kernels::CHORUS_ISA_NS {

extern const CpuKernels kCpuKernels = {
    CHORUS_ISA_LEVEL,
    pick_reduce,
    scale_avg,
    copy_streaming,
    relu_forward,
    relu_backward,
    add,
    mul,
    scale,
    axpy,
    fill,
    sum,
    add_row_bias,
    sum_rows,
    pool2x2_forward,
    pool2x2_backward,
    im2col,
    col2im,
    conv2d_forward,
    conv2d_backward,
    conv2d_forward_direct,
    conv2d_backward_direct,
    gemm_rows_dot,
    gemm_rows_axpy,
};

}  // namespace chorus::kernels::CHORUS_ISA_NS
