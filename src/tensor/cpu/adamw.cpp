// AdamW over flat f32 buffers, its forms for the precision-aware optimizer's moments (bf16 read
// and written by the same loop; fp16 and E4M3 codes, scaled, by adamw_step_scaled's two passes),
// and the sum of squares behind the global gradient norm.
//
// sum_squares sums fixed 4096-element chunks in double, then adds the chunk sums in order: the
// result is bit-identical for any thread count, which keeps runs reproducible. Inside a chunk the
// sum runs in vector lanes (a fixed order for a given build), four to eight times faster than one
// serial chain of double additions.
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/fp8.h"
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
      with_rounded_store<T>(rounded, [&](auto store) { run.template operator()<M, V>(store); });
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

namespace {

// How adamw_step_scaled reads and writes one moment stored as S: float, bf16, f16 (scaled) or
// uint8_t (E4M3 codes, scaled), a chunk at a time into and out of f32. Loads multiply by the read
// scale, stores by the store multiplier before rounding: the arithmetic of widening,
// scale_inplace and convert / fp8_encode in turn. f16 converts with the CPU's vcvtph2ps /
// vcvtps2ph (IEEE round to nearest even, as GCC's _Float16 casts), which GCC does not emit for
// those casts itself (the zero-masked forms: GCC 12 warns that the plain ones read an undefined
// source register).
template <typename S>
struct MomentIo {
  using Raw = std::conditional_t<std::is_same_v<S, uint8_t>, uint8_t, StoredAs<S>>;
  static constexpr bool kScaled = std::is_same_v<S, f16> || std::is_same_v<S, uint8_t>;
  const float* table = nullptr;  // E4M3 decoding
  float read = 1, store = 1;

  void widen(const Raw* src, float* dst, int64_t len) const {
    int64_t j = 0;
    if constexpr (std::is_same_v<S, f16>) {
#if defined(__AVX512F__)
      const __m512 r = _mm512_set1_ps(read);
      for (; j + 16 <= len; j += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j));
        _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), r));
      }
#elif defined(__F16C__)
      const __m256 r = _mm256_set1_ps(read);
      for (; j + 8 <= len; j += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
        _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_cvtph_ps(h), r));
      }
#endif
      for (; j < len; ++j) dst[j] = f16_to_f32(f16{src[j]}) * read;
    } else if constexpr (std::is_same_v<S, uint8_t>) {
#pragma omp simd
      for (j = 0; j < len; ++j) dst[j] = table[src[j]] * read;
    } else {
#pragma omp simd
      for (j = 0; j < len; ++j) dst[j] = loaded_value<S, float>(src[j]);
    }
  }
  void narrow(const float* src, Raw* dst, int64_t len) const {
    int64_t j = 0;
    if constexpr (std::is_same_v<S, f16>) {
#if defined(__AVX512F__)
      const __m512 sc = _mm512_set1_ps(store);
      for (; j + 16 <= len; j += 16) {
        const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(src + j), sc);
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(dst + j),
            _mm512_maskz_cvtps_ph(0xFFFF, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#elif defined(__F16C__)
      const __m256 sc = _mm256_set1_ps(store);
      for (; j + 8 <= len; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + j), sc);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; j < len; ++j) dst[j] = f32_to_f16(src[j] * store).bits;
    } else if constexpr (std::is_same_v<S, uint8_t>) {
#pragma omp simd
      for (j = 0; j < len; ++j)
        dst[j] = fp8_code_of(fp8_round(src[j] * store, Fp8Format::kE4M3), Fp8Format::kE4M3);
    } else {
#pragma omp simd
      for (j = 0; j < len; ++j) dst[j] = stored_value<S>(src[j]);
    }
  }
};

// Calls fn.template operator()<S>() with the S of a moment's storage dtype.
template <typename Fn>
void dispatch_moment(const Tensor& t, Fn&& fn) {
  switch (t.dtype()) {
    case DType::kBF16:
      return fn.template operator()<bf16>();
    case DType::kF16:
      return fn.template operator()<f16>();
    case DType::kU8:
      return fn.template operator()<uint8_t>();
    default:
      return fn.template operator()<float>();
  }
}

// The constants of one step (adamw_step's, so that the moments and weights come out as its do).
struct AdamConstants {
  float b1, b2, lr, wd, eps, gs, inv_bc1, inv_sqrt_bc2;
};

// Elements per chunk: the widened moments of one chunk stay in L1.
constexpr int64_t kMomentChunk = 512;

// Pass 1 of adamw_step_scaled: the new moments' absmaxes (NaN ignored, as abs_max ignores it),
// nothing written.
template <typename M, typename V>
void new_moment_absmax(const float* g, const typename MomentIo<M>::Raw* m,
                       const typename MomentIo<V>::Raw* v, int64_t n, MomentIo<M> mio,
                       MomentIo<V> vio, AdamConstants c, float* am_out, float* av_out) {
  const int64_t chunks = (n + kMomentChunk - 1) / kMomentChunk;
  float am = 0, av = 0;
#pragma omp parallel for schedule(static) reduction(max : am, av)
  for (int64_t k = 0; k < chunks; ++k) {
    alignas(64) float mt[kMomentChunk], vt[kMomentChunk];
    const int64_t i0 = k * kMomentChunk, len = std::min(kMomentChunk, n - i0);
    mio.widen(m + i0, mt, len);
    vio.widen(v + i0, vt, len);
    const float* gk = g + i0;
    float cm = 0, cv = 0;
#pragma omp simd reduction(max : cm, cv)
    for (int64_t j = 0; j < len; ++j) {
      const float gi = gk[j] * c.gs;
      const float mi = c.b1 * mt[j] + (1 - c.b1) * gi;
      const float vi = c.b2 * vt[j] + (1 - c.b2) * gi * gi;
      cm = std::max(cm, std::fabs(mi));
      cv = std::max(cv, std::fabs(vi));
    }
    am = std::max(am, cm);
    av = std::max(av, cv);
  }
  *am_out = am;
  *av_out = av;
}

// Pass 2: the step, the moments stored with their new scaling; R: the rounded copy's type (void
// for none).
template <typename M, typename V, typename R>
void scaled_step(float* p, const float* g, typename MomentIo<M>::Raw* m,
                 typename MomentIo<V>::Raw* v, StoredAs<R>* r, int64_t n, MomentIo<M> mio,
                 MomentIo<V> vio, AdamConstants c) {
  const int64_t chunks = (n + kMomentChunk - 1) / kMomentChunk;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    alignas(64) float mt[kMomentChunk], vt[kMomentChunk];
    const int64_t i0 = k * kMomentChunk, len = std::min(kMomentChunk, n - i0);
    mio.widen(m + i0, mt, len);
    vio.widen(v + i0, vt, len);
    float* pk = p + i0;
    const float* gk = g + i0;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const float gi = gk[j] * c.gs;
      const float mi = c.b1 * mt[j] + (1 - c.b1) * gi;
      const float vi = c.b2 * vt[j] + (1 - c.b2) * gi * gi;
      mt[j] = mi;
      vt[j] = vi;
      const float update =
          (mi * c.inv_bc1) / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps) + c.wd * pk[j];
      const float w = pk[j] - c.lr * update;
      pk[j] = w;
      if constexpr (!std::is_void_v<R>) r[i0 + j] = stored_value<R>(w);
    }
    mio.narrow(mt, m + i0, len);
    vio.narrow(vt, v + i0, len);
  }
}

}  // namespace

void adamw_step_scaled(Tensor& param, ops::StoredMoment exp_avg, ops::StoredMoment exp_avg_sq,
                       const Tensor& grad, const ops::AdamWSpec& spec, Tensor* rounded) {
  cpu::check_numel(param, grad, "adamw_step_scaled");
  cpu::check_numel(param, *exp_avg.stored, "adamw_step_scaled");
  cpu::check_numel(param, *exp_avg_sq.stored, "adamw_step_scaled");
  MEGATRON_CHECK(param.dtype() == DType::kF32 && grad.dtype() == DType::kF32,
                 "adamw_step_scaled: f32 weights and gradients, got ", param.str(), ", ",
                 grad.str());
  MEGATRON_CHECK(spec.step >= 1, "adamw_step_scaled: step must be >= 1, got ", spec.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(spec.beta1), spec.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(spec.beta2), spec.step);
  const AdamConstants c{spec.beta1,
                        spec.beta2,
                        spec.lr,
                        spec.weight_decay,
                        spec.eps,
                        static_cast<float>(spec.grad_scale),
                        static_cast<float>(1.0 / bc1),
                        static_cast<float>(1.0 / std::sqrt(bc2))};
  const int64_t n = param.numel();
  const float* table = fp8_decode_table(Fp8Format::kE4M3);
  dispatch_moment(*exp_avg.stored, [&]<typename M>() {
    dispatch_moment(*exp_avg_sq.stored, [&]<typename V>() {
      MomentIo<M> mio{table};
      MomentIo<V> vio{table};
      if constexpr (MomentIo<M>::kScaled) mio.read = *exp_avg.read_scale;
      if constexpr (MomentIo<V>::kScaled) vio.read = *exp_avg_sq.read_scale;
      auto* m = reinterpret_cast<typename MomentIo<M>::Raw*>(exp_avg.stored->raw());
      auto* v = reinterpret_cast<typename MomentIo<V>::Raw*>(exp_avg_sq.stored->raw());
      float am = 0, av = 0;
      if constexpr (MomentIo<M>::kScaled || MomentIo<V>::kScaled)
        new_moment_absmax<M, V>(grad.data<float>(), m, v, n, mio, vio, c, &am, &av);
      if constexpr (MomentIo<M>::kScaled) {
        const ops::MomentScaling s = ops::moment_scaling(am, exp_avg.stored->dtype());
        mio.store = s.store;
        *exp_avg.read_scale = s.read;
      }
      if constexpr (MomentIo<V>::kScaled) {
        const ops::MomentScaling s = ops::moment_scaling(av, exp_avg_sq.stored->dtype());
        vio.store = s.store;
        *exp_avg_sq.read_scale = s.read;
      }
      float* p = param.data<float>();
      const float* g = grad.data<float>();
      if (!rounded) {
        scaled_step<M, V, void>(p, g, m, v, nullptr, n, mio, vio, c);
      } else if (rounded->dtype() == DType::kBF16) {
        scaled_step<M, V, bf16>(p, g, m, v, stored_ptr(rounded->data<bf16>()), n, mio, vio, c);
      } else {
        scaled_step<M, V, f16>(p, g, m, v, stored_ptr(rounded->data<f16>()), n, mio, vio, c);
      }
    });
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
