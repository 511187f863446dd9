// Conversions between dtypes, fills, and the layout copies (column blocks, transposes, row
// gathers) of the CUDA device. Conversions go through double exactly as core/dtype.cpp does
// (f64 -> bf16 and f64 -> f16 round through f32 there, and here).
#include "tensor/cuda/common.cuh"

namespace megatron::cuda {
namespace {

// DType codes (core/dtype.h): kF32, kF64, kBF16, kF16, kI32, kI64.
enum Code { kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3, kI32 = 4, kI64 = 5 };

__device__ inline double load(const void* p, int t, int64_t i) {
  switch (t) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kF64:
      return static_cast<const double*>(p)[i];
    case kBF16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case kF16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case kI32:
      return static_cast<const int32_t*>(p)[i];
    default:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
}

__device__ inline void store(void* p, int t, int64_t i, double v) {
  switch (t) {
    case kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case kF64:
      static_cast<double*>(p)[i] = v;
      break;
    case kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(static_cast<float>(v));
      break;
    case kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(static_cast<float>(v));
      break;
    case kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    default:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
  }
}

__global__ void convert_kernel(void* dst, int dt, const void* src, int st, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    store(dst, dt, i, load(src, st, i));
  }
}
// The trainer's hot conversions without the detour through double.
__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    dst[i] = f32_to_bf16_bits(src[i]);
  }
}
__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    dst[i] = bf16_bits_to_f32(src[i]);
  }
}
__global__ void fill_kernel(void* dst, int dt, double v, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    store(dst, dt, i, v);
  }
}

template <typename E>
__global__ void copy_columns_kernel(E* out, int64_t out_row, int64_t out_col, const E* x,
                                    int64_t x_row, int64_t x_col, int64_t rows, int64_t width) {
  MEGATRON_GRID_LOOP(i, rows * width) {
    const int64_t r = i / width, c = i % width;
    out[r * out_row + out_col + c] = x[r * x_row + x_col + c];
  }
}

template <typename E>
__global__ void transpose_kernel(E* out, const E* x, int64_t rows, int64_t cols) {
  MEGATRON_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    out[c * rows + r] = x[i];
  }
}

template <typename E>
__global__ void gather_rows_kernel(E* out, const E* x, const void* index, bool i32, int64_t n,
                                   int64_t cols) {
  MEGATRON_GRID_LOOP(i, n * cols) {
    const int64_t r = i / cols, c = i % cols;
    const int64_t src =
        i32 ? static_cast<const int32_t*>(index)[r] : static_cast<const int64_t*>(index)[r];
    out[i] = x[src * cols + c];
  }
}

// Runs fn.template operator()<E>() with E an unsigned type of `elem` bytes.
template <typename Fn>
void by_size(size_t elem, const char* what, Fn&& fn) {
  switch (elem) {
    case 1:
      fn(uint8_t{});
      break;
    case 2:
      fn(uint16_t{});
      break;
    case 4:
      fn(uint32_t{});
      break;
    case 8:
      fn(uint64_t{});
      break;
    default:
      cuda_fail(what, "unsupported element size");
  }
}

}  // namespace

void convert(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n) {
  if (n == 0) return;
  if (src_dtype == kF32 && dst_dtype == kBF16) {
    f32_to_bf16_kernel<<<blocks_for(n), kThreads>>>(static_cast<uint16_t*>(dst),
                                                    static_cast<const float*>(src), n);
  } else if (src_dtype == kBF16 && dst_dtype == kF32) {
    bf16_to_f32_kernel<<<blocks_for(n), kThreads>>>(static_cast<float*>(dst),
                                                    static_cast<const uint16_t*>(src), n);
  } else {
    convert_kernel<<<blocks_for(n), kThreads>>>(dst, dst_dtype, src, src_dtype, n);
  }
  check_launch("convert");
}

void fill(void* dst, int dtype, double value, int64_t n) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads>>>(dst, dtype, value, n);
  check_launch("fill");
}

void copy_columns(void* out, int64_t out_row, int64_t out_col, const void* x, int64_t x_row,
                  int64_t x_col, int64_t rows, int64_t width, size_t elem) {
  if (rows * width == 0) return;
  by_size(elem, "copy_columns", [&](auto e) {
    using E = decltype(e);
    copy_columns_kernel<<<blocks_for(rows * width), kThreads>>>(static_cast<E*>(out), out_row,
                                                                out_col, static_cast<const E*>(x),
                                                                x_row, x_col, rows, width);
  });
  check_launch("copy_columns");
}

void transpose(void* out, const void* x, int64_t rows, int64_t cols, size_t elem) {
  if (rows * cols == 0) return;
  by_size(elem, "transpose", [&](auto e) {
    using E = decltype(e);
    transpose_kernel<<<blocks_for(rows * cols), kThreads>>>(static_cast<E*>(out),
                                                            static_cast<const E*>(x), rows, cols);
  });
  check_launch("transpose");
}

void gather_rows(void* out, const void* x, const void* index, bool index_i32, int64_t n,
                 int64_t cols, size_t elem) {
  if (n * cols == 0) return;
  by_size(elem, "gather_rows", [&](auto e) {
    using E = decltype(e);
    gather_rows_kernel<<<blocks_for(n * cols), kThreads>>>(
        static_cast<E*>(out), static_cast<const E*>(x), index, index_i32, n, cols);
  });
  check_launch("gather_rows");
}

}  // namespace megatron::cuda
