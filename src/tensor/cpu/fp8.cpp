// FP8 quantisation on the CPU: the amax of a tensor and its values rounded to an FP8 format after
// scaling (tensor/ops.h). The rounding is core/fp8.h's inline fp8_round, so these loops and the
// codec tested against the OCP specification are one definition.
#include <algorithm>
#include <cmath>
#include <vector>

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

// Calls run(p) with p x's elements as bf16*, double* or float* (f32, bf16 or f64 tensors: the
// inputs the kernels read, the outputs they write).
template <typename Fn>
void with_elements(const Tensor& x, Fn&& run) {
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

namespace {
// Blocks along a row (1 x bc): each block's amax, scale and values in one visit.
template <Fp8Format F, typename T, typename O>
void row_block_quantize(StoredAs<O>* out, const StoredAs<T>* x, int64_t rows, int64_t cols,
                        int64_t bc, Fp8BlockRule rule) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const StoredAs<T>* xr = x + r * cols;
    StoredAs<O>* yr = out + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t c1 = std::min(cols, c0 + bc);
      float m = 0;
#pragma omp simd reduction(max : m)
      for (int64_t c = c0; c < c1; ++c)
        m = std::fmax(m, std::fabs(loaded_value<T, float>(xr[c])));  // fmax drops NaN
      const Fp8BlockScale s = fp8_block_scale(m, rule, F);
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c)
        yr[c] =
            stored_value<O>(fp8_round(loaded_value<T, float>(xr[c]) * s.scale, F) * s.scale_inv);
    }
  }
}

// Blocks down the columns (br x 1) and tiles (br x bc): one block row at a time (a thread's): the
// column maxima over its rows, each block's maximum and scale spread back over its columns, then
// the values; the column loops vectorise.
template <Fp8Format F, typename T, typename O>
void block_quantize(StoredAs<O>* out, const StoredAs<T>* x, int64_t rows, int64_t cols, int64_t br,
                    int64_t bc, Fp8BlockRule rule) {
  if (br == 1) return row_block_quantize<F, T, O>(out, x, rows, cols, bc, rule);
  const int64_t block_rows = (rows + br - 1) / br;
#pragma omp parallel if (rows * cols >= (1 << 16))
  {
    std::vector<float> amax(static_cast<size_t>(cols)), scale(amax.size()), inv(amax.size());
#pragma omp for schedule(static)
    for (int64_t bi = 0; bi < block_rows; ++bi) {
      const int64_t r0 = bi * br, r1 = std::min(rows, r0 + br);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r) {
        const StoredAs<T>* xr = x + r * cols;
        float* a = amax.data();
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c)
          a[c] = std::fmax(a[c], std::fabs(loaded_value<T, float>(xr[c])));  // fmax drops NaN
      }
      for (int64_t c0 = 0; c0 < cols; c0 += bc) {
        const int64_t c1 = std::min(cols, c0 + bc);
        float m = 0;
        for (int64_t c = c0; c < c1; ++c) m = std::fmax(m, amax[c]);
        const Fp8BlockScale s = fp8_block_scale(m, rule, F);
        std::fill(scale.begin() + c0, scale.begin() + c1, s.scale);
        std::fill(inv.begin() + c0, inv.begin() + c1, s.scale_inv);
      }
      for (int64_t r = r0; r < r1; ++r) {
        const StoredAs<T>* xr = x + r * cols;
        StoredAs<O>* yr = out + r * cols;
        const float *ps = scale.data(), *pi = inv.data();
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c)
          yr[c] = stored_value<O>(fp8_round(loaded_value<T, float>(xr[c]) * ps[c], F) * pi[c]);
      }
    }
  }
}
}  // namespace

void fp8_block_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        Fp8BlockRule rule, Fp8Format format) {
  const int64_t cols = x.dim(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  auto run = [&]<typename T, typename O>(const T* px, O* po) {
    with_format(format, [&]<Fp8Format F>() {
      block_quantize<F, T, O>(stored_ptr(po), stored_ptr(px), rows, cols, block_rows, block_cols,
                              rule);
    });
  };
  switch (x.dtype()) {
    case DType::kF64:
      run(x.data<double>(), out.data<double>());
      break;
    case DType::kBF16:
      run(x.data<bf16>(), out.data<bf16>());
      break;
    default:
      run(x.data<float>(), out.data<bf16>());
  }
}

void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format) {
  const int64_t n = x.numel();
  auto* pc = codes.data<uint8_t>();
  auto run = [&]<typename T>(const T* px) {
    with_format(format, [&]<Fp8Format F>() { encode<F, T>(pc, stored_ptr(px), n, scale); });
  };
  with_elements(x, run);
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

namespace {
// Calls fn(tile, begin, end) for each piece [begin, end) of a run of n elements that lies in one
// tile and one matrix row, in order (the loops over a piece's elements then vectorise).
template <typename Fn>
void for_each_tile_piece(const Fp8Tiles& t, int64_t n, Fn&& fn) {
  const int64_t across = (t.cols + t.block_cols - 1) / t.block_cols;
  for (int64_t i = 0; i < n;) {
    const int64_t g = t.offset + i, r = g / t.cols, c = g % t.cols;
    const int64_t stop = std::min({t.cols, (c / t.block_cols + 1) * t.block_cols, c + (n - i)});
    fn(r / t.block_rows * across + c / t.block_cols, i, i + stop - c);
    i += stop - c;
  }
}

// The same pieces, listed, then handed to fn across the threads (each piece is written by one).
template <typename Fn>
void for_each_tile_piece_parallel(const Fp8Tiles& t, int64_t n, Fn&& fn) {
  struct Piece {
    int64_t tile, begin, end;
  };
  std::vector<Piece> pieces;
  for_each_tile_piece(t, n, [&](int64_t tile, int64_t b, int64_t e) {
    pieces.push_back({tile, b, e});
  });
  const auto count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t k = 0; k < count; ++k) fn(pieces[k].tile, pieces[k].begin, pieces[k].end);
}
}  // namespace

void fp8_tile_abs_max(Tensor& amax, const Tensor& x, const Fp8Tiles& tiles) {
  float* a = amax.data<float>();
  auto run = [&]<typename T>(const T* px) {
    const StoredAs<T>* p = stored_ptr(px);
    for_each_tile_piece(tiles, x.numel(), [&](int64_t tile, int64_t b, int64_t e) {
      float m = a[tile];
#pragma omp simd reduction(max : m)
      for (int64_t i = b; i < e; ++i) m = std::fmax(m, std::fabs(loaded_value<T, float>(p[i])));
      a[tile] = m;
    });
  };
  with_elements(x, run);
}

void fp8_tile_encode(Tensor& codes, const Tensor& x, const Fp8Tiles& tiles, const Tensor& scales,
                     Fp8Format format) {
  uint8_t* pc = codes.data<uint8_t>();
  const float* ps = scales.data<float>();
  auto run = [&]<typename T>(const T* px) {
    const StoredAs<T>* p = stored_ptr(px);
    with_format(format, [&]<Fp8Format F>() {
      for_each_tile_piece_parallel(tiles, x.numel(), [&](int64_t tile, int64_t b, int64_t e) {
        const float s = ps[tile];
#pragma omp simd
        for (int64_t i = b; i < e; ++i)
          pc[i] = fp8_code_of(fp8_round(loaded_value<T, float>(p[i]) * s, F), F);
      });
    });
  };
  with_elements(x, run);
}

void fp8_tile_decode(Tensor& out, const Tensor& codes, const Fp8Tiles& tiles,
                     const Tensor& scale_inv, Fp8Format format) {
  const auto* pc = codes.data<uint8_t>();
  const float* table = fp8_decode_table(format);
  const float* pi = scale_inv.data<float>();
  auto run = [&]<typename O>(O* po) {
    StoredAs<O>* p = stored_ptr(po);
    for_each_tile_piece_parallel(tiles, out.numel(), [&](int64_t tile, int64_t b, int64_t e) {
      const float f = pi[tile];
      for (int64_t i = b; i < e; ++i) p[i] = stored_value<O>(table[pc[i]] * f);
    });
  };
  with_elements(out, run);
}

}  // namespace megatron::cpu
