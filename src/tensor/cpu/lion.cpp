// Lion over flat buffers (--optimizer lion, Muon's --muon-scalar-optimizer lion): one pass over
// memory that also writes the 16-bit compute copy of mixed-precision runs.
#include <cmath>
#include <cstdint>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"
#include "tensor/ops.h"

namespace megatron::cpu {

namespace {
// torch.lerp's two forms as its vectorised CPU kernel rounds them: fmadd(w, end - start, start)
// below w = 0.5, fnmadd(end - start, 1 - w, end) from it (this file is compiled without
// contraction: the fused multiply-adds are the explicit ones).
template <typename T>
T lerp(T start, T end, T w) {
  const T diff = end - start;
  return w < T(0.5) ? std::fma(w, diff, start) : std::fma(-diff, T(1) - w, end);
}
}  // namespace

void lion_step(Tensor& param, Tensor& exp_avg, const Tensor& grad, const LionSpec& spec,
               Tensor* rounded) {
  cpu::check_numel(param, grad, "lion_step");
  cpu::check_numel(param, exp_avg, "lion_step");
  cpu::dispatch_float(param, "lion_step", [&]<typename T>() {
    T* p = param.data<T>();
    T* m = exp_avg.data<T>();
    const T* g = grad.data<T>();
    const T lr = spec.lr, w1 = spec.weight1, w2 = spec.weight2, decay = spec.decay;
    const T gs = static_cast<T>(spec.grad_scale);
    const int64_t n = param.numel();
    // emerging_optimizers' order: p.add_(p, alpha=-wd lr), then the update from the old moment,
    // the moment's own lerp, p.add_(sign(update), alpha=-lr) (each add_ a fused multiply-add).
    auto run = [&](auto store) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const T gi = g[i] * gs;
        const T w = std::fma(decay, p[i], p[i]);
        const T u = lerp(m[i], gi, w1);
        m[i] = lerp(m[i], gi, w2);
        const T s = std::isnan(u) ? u : static_cast<T>((u > T(0)) - (u < T(0)));
        const T out = std::fma(-lr, s, w);
        p[i] = out;
        store(i, out);
      }
    };
    with_rounded_store<T>(rounded, run);
  });
}

}  // namespace megatron::cpu
