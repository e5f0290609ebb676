// log_softmax over the last dimension of a (rows, cols) matrix, and the negative log-likelihood
// loss on its output, forward and backward side by side.
#pragma once

#include <cstdint>

namespace chorus::kernels::cpu {

// x (rows, cols) -> y (rows, cols), y = x - max - log(sum(exp(x - max)))
void log_softmax_forward(int rows, int cols, const float* x, float* y);
// dx = dy - exp(y) * sum(dy) per row
void log_softmax_backward(int rows, int cols, const float* y, const float* dy, float* dx);

// logp (rows, cols), labels (rows) in [0, cols) -> sum over rows of -logp[r, label[r]]
// (the caller divides by rows for reduction "mean"). Accumulated in double.
float nll_forward(int rows, int cols, const float* logp, const int32_t* labels);
// dlogp = 0 except dlogp[r, label[r]] = -scale (scale = dloss, or dloss / rows for "mean")
void nll_backward(int rows, int cols, const int32_t* labels, float scale, float* dlogp);

// argmax of each row (first maximum wins)
void argmax_rows(int rows, int cols, const float* x, int32_t* out);

}  // namespace chorus::kernels::cpu
