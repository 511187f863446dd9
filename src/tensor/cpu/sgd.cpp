// SGD with momentum over flat buffers (Megatron's --optimizer sgd), one pass over memory that also
// writes the 16-bit compute copy of mixed-precision runs.
#include <cmath>
#include <cstdint>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"
#include "tensor/ops.h"

namespace megatron::cpu {

void sgd_step(Tensor& param, Tensor& momentum_buffer, const Tensor& grad, const SgdSpec& spec,
              Tensor* rounded) {
  cpu::check_numel(param, grad, "sgd_step");
  const bool buffer = spec.momentum != 0;
  if (buffer) cpu::check_numel(param, momentum_buffer, "sgd_step");
  cpu::dispatch_float(param, "sgd_step", [&]<typename T>() {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = buffer ? momentum_buffer.data<T>() : nullptr;
    const T lr = spec.lr, mu = spec.momentum, wd = spec.weight_decay;
    const T gs = static_cast<T>(spec.grad_scale);
    const bool first = spec.first;
    const int64_t n = param.numel();
    // In FusedSGD's order: the decay joins the (clipped) gradient, the buffer takes the sum (a
    // copy on its first step), the weight moves by lr times the buffer. The roundings are
    // torch.optim.SGD's on the CPU (this file is compiled without contraction, the fused
    // multiply-adds are explicit): the clipped gradient rounded (clipping scales it in place),
    // add(x, alpha) as one fused multiply-add, the buffer's mul_ rounded before its add_.
    auto run = [&](auto store) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const T gi = g[i] * gs;
        T d = std::fma(wd, p[i], gi);
        if (buf) {
          if (!first) d = buf[i] * mu + d;
          buf[i] = d;
        }
        const T w = std::fma(-lr, d, p[i]);
        p[i] = w;
        store(i, w);
      }
    };
    with_rounded_store<T>(rounded, run);
  });
}

}  // namespace megatron::cpu
