#include "kernels/cpu/sgd.h"

namespace chorus::kernels::cpu {

// The branches are loop-invariant, so the compiler unswitches them and vectorises each variant
// (restrict: param, grad and buffer never overlap).
void sgd_update(const SgdStep& step, long n, float* __restrict w, const float* __restrict grad,
                float* __restrict buf, bool first) {
  const SgdStep o = step;  // a local copy: stores to w cannot alias it, so the loop vectorises
  for (long j = 0; j < n; ++j) {
    float d = grad[j];
    if (o.weight_decay != 0.0f) d = d + o.weight_decay * w[j];  // d_p = d_p.add(param, alpha=wd)
    if (buf) {
      if (first)
        buf[j] = d;  // buf = clone(d_p)
      else
        buf[j] =
            buf[j] * o.momentum + (1.0f - o.dampening) * d;  // buf.mul_(m).add_(d_p, alpha=1-damp)
      d = o.nesterov ? d + o.momentum * buf[j] : buf[j];     // d_p = d_p.add(buf, alpha=m) | buf
    }
    w[j] = w[j] + (-o.lr) * d;  // param.add_(d_p, alpha=-lr)
  }
}

}  // namespace chorus::kernels::cpu
