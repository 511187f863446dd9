// FP8 quantisation on the CUDA device (tensor/ops.h abs_max and fp8_quantize): the rounding of
// core/fp8.h's fp8_round restated for device code (the same bit operations; the op harness checks
// it against the reference device's codec on a GPU), the amax as per-block maxima read back and
// combined on the host in block order.
#include <vector>

#include "tensor/cuda/common.cuh"

namespace megatron::cuda {
namespace {

enum Code { kF32 = 0, kF64 = 1, kBF16 = 2 };  // core/dtype.h's DType values

__device__ inline float load_f32(const void* p, int t, int64_t i) {
  if (t == kBF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (t == kF64) return static_cast<float>(static_cast<const double*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ inline float fp8_round_device(float x, bool e4m3) {
  if (isnan(x)) return x;
  const int drop = e4m3 ? 20 : 21;
  const float max_finite = e4m3 ? 448.0f : 57344.0f;
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float magic = e4m3 ? 0x1p14f : 0x1p7f;
  const float a = fabsf(x);
  float r;
  if (a < min_normal) {
    r = __fsub_rn(__fadd_rn(a, magic),
                  magic);  // explicit RNE ops: never contracted or reassociated
  } else {
    uint32_t u = __float_as_uint(a);
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
    u &= ~((1u << drop) - 1);
    r = __uint_as_float(u);
  }
  return copysignf(fminf(r, max_finite), x);
}

constexpr int64_t kChunk = 16384;

__global__ void abs_max_kernel(double* partial, const void* x, int t, int64_t n) {
  __shared__ double shared[32];
  const int64_t begin = blockIdx.x * kChunk, end = min(n, begin + kChunk);
  double m = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = t == kF64 ? fabs(static_cast<const double*>(x)[i]) : fabsf(load_f32(x, t, i));
    m = fmax(m, v);  // fmax drops NaN
  }
  m = block_max(m, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

__global__ void fp8_quantize_kernel(void* out, const void* x, int t, int64_t n, float scale,
                                    bool e4m3) {
  MEGATRON_GRID_LOOP(i, n) {
    const float r = fp8_round_device(__fmul_rn(load_f32(x, t, i), scale), e4m3);
    if (t == kF64)
      static_cast<double*>(out)[i] = r;
    else
      static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(r);  // exact: FP8 values fit bf16
  }
}

// fp8_code_of (core/fp8.h) for device code: the code of an FP8 value, or NaN.
__device__ inline uint8_t fp8_code_device(float r, bool e4m3) {
  const uint32_t u = __float_as_uint(r);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (isnan(r)) return sign | 0x7F;
  const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const float a = fabsf(r);
  if (a < (e4m3 ? 0x1p-6f : 0x1p-14f))
    return sign | static_cast<uint8_t>(__fmul_rn(a, e4m3 ? 0x1p9f : 0x1p16f));
  const uint32_t exponent = ((u >> 23) & 0xFFu) - 127u + static_cast<uint32_t>(bias);
  const uint32_t mantissa = (u >> (23 - man)) & ((1u << man) - 1u);
  return sign | static_cast<uint8_t>((exponent << man) | mantissa);
}

// fp8_decode (core/fp8.cpp) for device code.
__device__ inline float fp8_value_device(uint8_t code, bool e4m3) {
  const int m = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int magnitude = code & 0x7F;
  const int exponent = magnitude >> m, mantissa = magnitude & ((1 << m) - 1);
  if (e4m3 && magnitude == 0x7F) return __int_as_float(0x7FC00000);
  if (!e4m3 && exponent == 31) return mantissa == 0 ? sign * INFINITY : __int_as_float(0x7FC00000);
  if (exponent == 0) return sign * ldexpf(static_cast<float>(mantissa), 1 - bias - m);
  return sign * ldexpf(static_cast<float>((1 << m) + mantissa), exponent - bias - m);
}

__global__ void fp8_encode_kernel(uint8_t* codes, const void* x, int t, int64_t n, float scale,
                                  bool e4m3) {
  MEGATRON_GRID_LOOP(i, n) {
    codes[i] = fp8_code_device(fp8_round_device(__fmul_rn(load_f32(x, t, i), scale), e4m3), e4m3);
  }
}

__global__ void fp8_decode_kernel(void* out, int t, const uint8_t* codes, int64_t n, bool e4m3) {
  MEGATRON_GRID_LOOP(i, n) {
    const float v = fp8_value_device(codes[i], e4m3);
    if (t == kF64)
      static_cast<double*>(out)[i] = v;
    else if (t == kBF16)
      static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);  // exact
    else
      static_cast<float*>(out)[i] = v;
  }
}

// core/fp8.h's fp8_block_scale for device code: {scale, scale_inv} of a block's amax.
__device__ inline float2 block_scale_device(float amax, bool mxfp8, bool e4m3) {
  const float max = e4m3 ? 448.0f : 57344.0f;
  if (mxfp8) {
    const float v = __fmul_rn(amax, 1.0f / max);
    uint32_t e;
    if (isnan(v)) {
      e = 0xFF;
    } else if (isinf(v)) {
      e = 0xFE;
    } else if (v == 0.0f) {
      e = 0;
    } else {
      const uint32_t bits = __float_as_uint(v);
      e = (bits >> 23) & 0xFFu;
      const uint32_t mantissa = bits & 0x7FFFFFu;
      if (mantissa > 0 && e != 0xFE && !(e == 0 && mantissa <= 0x400000u)) ++e;
    }
    const float scale = e == 0 ? 1.0f : e >= 254 ? 0.0f : ldexpf(1.0f, 127 - static_cast<int>(e));
    return make_float2(
        scale, e == 255 ? __int_as_float(0x7FC00000) : ldexpf(1.0f, static_cast<int>(e) - 127));
  }
  if (amax == 0.0f || !isfinite(amax)) return make_float2(1.0f, 1.0f);
  float s = __fdiv_rn(max, amax);
  if (isinf(s)) s = 0x1p127f;
  s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
  return make_float2(s, __fdiv_rn(1.0f, s));
}

// One thread per block of block_rows x block_cols: its amax, then its values.
__global__ void fp8_block_quantize_kernel(void* out, const void* x, int t, int64_t rows,
                                          int64_t cols, int64_t br, int64_t bc, bool mxfp8,
                                          bool e4m3) {
  const int64_t blocks_across = (cols + bc - 1) / bc;
  const int64_t n_blocks = (rows + br - 1) / br * blocks_across;
  MEGATRON_GRID_LOOP(b, n_blocks) {
    const int64_t r0 = b / blocks_across * br, c0 = b % blocks_across * bc;
    const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
    float amax = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = fmaxf(amax, fabsf(load_f32(x, t, r * cols + c)));
    const float2 s = block_scale_device(amax, mxfp8, e4m3);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = r * cols + c;
        const float v = __fmul_rn(fp8_round_device(__fmul_rn(load_f32(x, t, i), s.x), e4m3), s.y);
        if (t == kF64)
          static_cast<double*>(out)[i] = v;
        else
          static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);  // exact: a power-of-two factor
      }
    }
  }
}

__device__ inline int64_t tile_of_device(int64_t g, int64_t cols, int64_t br, int64_t bc) {
  return g / cols / br * ((cols + bc - 1) / bc) + g % cols / bc;
}

// One thread per element of the run: its magnitude into its tile's slot by an integer atomic max
// (the slots and magnitudes are non-negative floats, which order as their bit patterns); NaN is
// skipped, as fmaxf drops it.
__global__ void fp8_tile_abs_max_kernel(float* amax, const void* x, int t, int64_t n,
                                        int64_t offset, int64_t cols, int64_t br, int64_t bc) {
  MEGATRON_GRID_LOOP(i, n) {
    const float v = fabsf(load_f32(x, t, i));
    if (!isnan(v))
      atomicMax(reinterpret_cast<int*>(amax + tile_of_device(offset + i, cols, br, bc)),
                __float_as_int(v));
  }
}

__global__ void fp8_tile_encode_kernel(uint8_t* codes, const void* x, int t, int64_t n,
                                       int64_t offset, int64_t cols, int64_t br, int64_t bc,
                                       const float* scales, bool e4m3) {
  MEGATRON_GRID_LOOP(i, n) {
    const float s = scales[tile_of_device(offset + i, cols, br, bc)];
    codes[i] = fp8_code_device(fp8_round_device(__fmul_rn(load_f32(x, t, i), s), e4m3), e4m3);
  }
}

__global__ void fp8_tile_decode_kernel(void* out, int t, const uint8_t* codes, int64_t n,
                                       int64_t offset, int64_t cols, int64_t br, int64_t bc,
                                       const float* scale_inv, bool e4m3) {
  MEGATRON_GRID_LOOP(i, n) {
    const float v = __fmul_rn(fp8_value_device(codes[i], e4m3),
                              scale_inv[tile_of_device(offset + i, cols, br, bc)]);
    if (t == kF64)
      static_cast<double*>(out)[i] = v;
    else if (t == kBF16)
      static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);
    else
      static_cast<float*>(out)[i] = v;
  }
}

}  // namespace

double abs_max(const void* x, int dtype, int64_t n) {
  if (n == 0) return 0;
  const int64_t nb = (n + kChunk - 1) / kChunk;
  double* partial = static_cast<double*>(workspace(sizeof(double) * nb, 1));
  abs_max_kernel<<<static_cast<unsigned>(nb), kThreads>>>(partial, x, dtype, n);
  check_launch("abs_max");
  std::vector<double> host(static_cast<size_t>(nb));
  copy_to_host(host.data(), partial, sizeof(double) * nb);
  double m = 0;
  for (double v : host) m = v > m ? v : m;
  return m;
}

void fp8_quantize(void* out, const void* x, int x_dtype, int64_t n, float scale, bool e4m3) {
  if (n == 0) return;
  fp8_quantize_kernel<<<blocks_for(n), kThreads>>>(out, x, x_dtype, n, scale, e4m3);
  check_launch("fp8_quantize");
}

void fp8_block_quantize(void* out, const void* x, int x_dtype, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, bool mxfp8, bool e4m3) {
  if (rows == 0 || cols == 0) return;
  const int64_t n_blocks =
      (rows + block_rows - 1) / block_rows * ((cols + block_cols - 1) / block_cols);
  fp8_block_quantize_kernel<<<blocks_for(n_blocks), kThreads>>>(
      out, x, x_dtype, rows, cols, block_rows, block_cols, mxfp8, e4m3);
  check_launch("fp8_block_quantize");
}

void fp8_encode(void* codes, const void* x, int x_dtype, int64_t n, float scale, bool e4m3) {
  if (n == 0) return;
  fp8_encode_kernel<<<blocks_for(n), kThreads>>>(static_cast<uint8_t*>(codes), x, x_dtype, n, scale,
                                                 e4m3);
  check_launch("fp8_encode");
}

void fp8_decode(void* out, int out_dtype, const void* codes, int64_t n, bool e4m3) {
  if (n == 0) return;
  fp8_decode_kernel<<<blocks_for(n), kThreads>>>(out, out_dtype, static_cast<const uint8_t*>(codes),
                                                 n, e4m3);
  check_launch("fp8_decode");
}

void fp8_tile_abs_max(float* amax, int64_t n_tiles, const void* x, int x_dtype, int64_t n,
                      int64_t offset, int64_t cols, int64_t br, int64_t bc) {
  if (n == 0 || n_tiles == 0) return;
  fp8_tile_abs_max_kernel<<<blocks_for(n), kThreads>>>(amax, x, x_dtype, n, offset, cols, br, bc);
  check_launch("fp8_tile_abs_max");
}

void fp8_tile_encode(void* codes, const void* x, int x_dtype, int64_t n, int64_t offset,
                     int64_t cols, int64_t br, int64_t bc, const float* scales, bool e4m3) {
  if (n == 0) return;
  fp8_tile_encode_kernel<<<blocks_for(n), kThreads>>>(static_cast<uint8_t*>(codes), x, x_dtype, n,
                                                      offset, cols, br, bc, scales, e4m3);
  check_launch("fp8_tile_encode");
}

void fp8_tile_decode(void* out, int out_dtype, const void* codes, int64_t n, int64_t offset,
                     int64_t cols, int64_t br, int64_t bc, const float* scale_inv, bool e4m3) {
  if (n == 0) return;
  fp8_tile_decode_kernel<<<blocks_for(n), kThreads>>>(
      out, out_dtype, static_cast<const uint8_t*>(codes), n, offset, cols, br, bc, scale_inv, e4m3);
  check_launch("fp8_tile_decode");
}

}  // namespace megatron::cuda
