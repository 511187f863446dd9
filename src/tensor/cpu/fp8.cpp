// FP8 quantisation on the CPU: the amax of a tensor and its values rounded to an FP8 format after
// scaling (tensor/ops.h). The rounding is core/fp8.h's inline fp8_round, so these loops and the
// codec tested against the OCP specification are one definition.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"

namespace megatron::cpu {
namespace {

template <typename T>
float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_f32(p[i]);
  else
    return static_cast<float>(p[i]);
}

template <typename T>
double abs_max_of(const T* p, int64_t n) {
  double m = 0;
  if constexpr (std::is_same_v<T, double>) {
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(p[i]));  // fmax drops NaN
  } else {
    float mf = 0;
#pragma omp parallel for simd schedule(static) reduction(max : mf)
    for (int64_t i = 0; i < n; ++i) mf = std::fmax(mf, std::fabs(load(p, i)));
    m = mf;
  }
  return m;
}

}  // namespace

double abs_max(const Tensor& x) {
  switch (x.dtype()) {
    case DType::kF32:
      return abs_max_of(x.data<float>(), x.numel());
    case DType::kBF16:
      return abs_max_of(x.data<bf16>(), x.numel());
    case DType::kF64:
      return abs_max_of(x.data<double>(), x.numel());
    default:
      MEGATRON_CHECK(false, "abs_max: x must be f32, bf16 or f64, got ", x.str());
  }
}

namespace {
// Calls fn.template operator()<F>() with the format as a constant (the rounding's constants then
// fold and the loops vectorise).
template <typename Fn>
void with_format(Fp8Format format, Fn&& fn) {
  if (format == Fp8Format::kE4M3) {
    fn.template operator()<Fp8Format::kE4M3>();
  } else {
    fn.template operator()<Fp8Format::kE5M2>();
  }
}

// The loops, on plain pointers and values (read through a lambda's captures, every pointer would
// be reloaded after each one-byte store, which may alias it, and the loop would stay scalar).
template <Fp8Format F, typename T>
void quantize_into_bf16(StoredAs<bf16>* out, const StoredAs<T>* x, int64_t n, float scale) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = stored_value<bf16>(fp8_round(loaded_value<T, float>(x[i]) * scale, F));
}

template <Fp8Format F, typename T>
void encode(uint8_t* codes, const StoredAs<T>* x, int64_t n, float scale) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i)
    codes[i] = fp8_code_of(fp8_round(loaded_value<T, float>(x[i]) * scale, F), F);
}
}  // namespace

void fp8_quantize(Tensor& out, const Tensor& x, float scale, Fp8Format format) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::kF64) {
    const double* px = x.data<double>();
    double* po = out.data<double>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) po[i] = fp8_round(static_cast<float>(px[i]) * scale, format);
    return;
  }
  // bf16 holds every FP8 value exactly: the store's rounding changes nothing.
  StoredAs<bf16>* po = stored_ptr(out.data<bf16>());
  auto run = [&]<typename T>(const T* px) {
    with_format(format,
                [&]<Fp8Format F>() { quantize_into_bf16<F, T>(po, stored_ptr(px), n, scale); });
  };
  if (x.dtype() == DType::kBF16)
    run(x.data<bf16>());
  else
    run(x.data<float>());
}

void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format) {
  const int64_t n = x.numel();
  auto* pc = codes.data<uint8_t>();
  auto run = [&]<typename T>(const T* px) {
    with_format(format, [&]<Fp8Format F>() { encode<F, T>(pc, stored_ptr(px), n, scale); });
  };
  switch (x.dtype()) {
    case DType::kBF16:
      run(x.data<bf16>());
      break;
    case DType::kF64:
      run(x.data<double>());
      break;
    default:
      run(x.data<float>());
  }
}

void fp8_decode(Tensor& out, const Tensor& codes, Fp8Format format) {
  const int64_t n = out.numel();
  const auto* pc = codes.data<uint8_t>();
  const float* table = fp8_decode_table(format);
  switch (out.dtype()) {
    case DType::kBF16: {
      bf16* po = out.data<bf16>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = f32_to_bf16(table[pc[i]]);  // exact
      break;
    }
    case DType::kF64: {
      double* po = out.data<double>();
      for (int64_t i = 0; i < n; ++i) po[i] = table[pc[i]];
      break;
    }
    default: {
      float* po = out.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = table[pc[i]];
    }
  }
}

}  // namespace megatron::cpu
