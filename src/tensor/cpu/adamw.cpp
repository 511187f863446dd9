// AdamW over flat f32 buffers, and the sum of squares behind the global gradient norm.
//
// sum_squares sums fixed 4096-element chunks in double, then adds the chunk sums in order: the
// result is bit-identical for any thread count, which keeps runs reproducible. Inside a chunk the
// sum runs in vector lanes (a fixed order for a given build), four to eight times faster than one
// serial chain of double additions.
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"
#include "tensor/ops.h"

namespace megatron::cpu {

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec, Tensor* rounded) {
  cpu::check_numel(param, grad, "adamw_step");
  cpu::check_numel(param, exp_avg, "adamw_step");
  cpu::check_numel(param, exp_avg_sq, "adamw_step");
  MEGATRON_CHECK(spec.step >= 1, "adamw_step: step must be >= 1, got ", spec.step);
  cpu::dispatch_float(param, "adamw_step", [&]<typename T>() {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    const double bc1 = 1.0 - std::pow(static_cast<double>(spec.beta1), spec.step);
    const double bc2 = 1.0 - std::pow(static_cast<double>(spec.beta2), spec.step);
    const T b1 = spec.beta1, b2 = spec.beta2, lr = spec.lr, wd = spec.weight_decay;
    const T eps = spec.eps, gs = static_cast<T>(spec.grad_scale);
    const T inv_bc1 = static_cast<T>(1.0 / bc1),
            inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
    const int64_t n = param.numel();
    // M, V: how the moments are stored (T, or bf16 for the precision-aware optimizer's
    // --exp-avg-dtype / --exp-avg-sq-dtype bf16: read exactly, rounded as convert() rounds);
    // store(i, w): what else the pass writes of the updated weight w.
    auto run = [&]<typename M, typename V>(auto store) {
      const StoredAs<M>* m_in = stored_ptr(exp_avg.data<M>());
      const StoredAs<V>* v_in = stored_ptr(exp_avg_sq.data<V>());
      StoredAs<M>* m_out = stored_ptr(exp_avg.data<M>());
      StoredAs<V>* v_out = stored_ptr(exp_avg_sq.data<V>());
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const T gi = g[i] * gs;
        T mi = b1 * loaded_value<M, T>(m_in[i]) + (1 - b1) * gi;
        T vi = b2 * loaded_value<V, T>(v_in[i]) + (1 - b2) * gi * gi;
        m_out[i] = stored_value<M>(mi);
        v_out[i] = stored_value<V>(vi);
        T update = (mi * inv_bc1) / (std::sqrt(vi) * inv_sqrt_bc2 + eps) + wd * p[i];
        const T w = p[i] - lr * update;
        p[i] = w;
        store(i, w);
      }
    };
    // The 16-bit copies round through f32, as convert() does from either source dtype.
    auto with_store = [&]<typename M, typename V>() {
      if (!rounded) {
        run.template operator()<M, V>([](int64_t, T) {});
      } else if (rounded->dtype() == DType::kBF16) {
        StoredAs<bf16>* r = stored_ptr(rounded->data<bf16>());
        run.template operator()<M, V>([r](int64_t i, T w) { r[i] = stored_value<bf16>(w); });
      } else {
        StoredAs<f16>* r = stored_ptr(rounded->data<f16>());
        run.template operator()<M, V>([r](int64_t i, T w) { r[i] = stored_value<f16>(w); });
      }
    };
    const bool m16 = exp_avg.dtype() == DType::kBF16, v16 = exp_avg_sq.dtype() == DType::kBF16;
    if constexpr (std::is_same_v<T, float>) {
      if (m16 && v16) return with_store.template operator()<bf16, bf16>();
      if (m16) return with_store.template operator()<bf16, T>();
      if (v16) return with_store.template operator()<T, bf16>();
    }
    MEGATRON_CHECK(exp_avg.dtype() == param.dtype() && exp_avg_sq.dtype() == param.dtype(),
                   "adamw_step: moments ", exp_avg.str(), ", ", exp_avg_sq.str(),
                   " must have the weights' dtype (or bf16 with f32 weights)");
    with_store.template operator()<T, T>();
  });
}

double sum_squares(const Tensor& x) {
  constexpr int64_t kChunk = 4096;
  const int64_t n = x.numel();
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(nchunks));
  cpu::dispatch_float(x, "sum_squares", [&]<typename T>() {
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      double s = 0;
      const int64_t i1 = std::min(n, (c + 1) * kChunk);
#pragma omp simd reduction(+ : s)
      for (int64_t i = c * kChunk; i < i1; ++i) s += static_cast<double>(p[i]) * p[i];
      partial[c] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

int64_t count_zeros(const Tensor& x) {
  const int64_t n = x.numel();
  int64_t zeros = 0;
  cpu::dispatch_float(x, "count_zeros", [&]<typename T>() {
    const T* p = x.data<T>();
#pragma omp parallel for schedule(static) reduction(+ : zeros)
    for (int64_t i = 0; i < n; ++i) zeros += static_cast<float>(p[i]) == 0.0f;
  });
  return zeros;
}

}  // namespace megatron::cpu
