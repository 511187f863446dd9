// Helpers shared by the CUDA kernels: launch shapes, warp reductions, the project's Philox and
// its bf16 rounding (bit-identical to core/philox.h and core/dtype.h, so that CPU and GPU runs
// draw the same dropout masks and round to the same bf16 values).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/kernels.h"

namespace megatron::cuda {

constexpr int kThreads = 256;

// Blocks for n elements at kThreads each (grid-stride loops cover the rest).
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return static_cast<unsigned>(b);
}

#define MEGATRON_GRID_LOOP(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ inline T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of kThreads threads, the result in every thread. `shared` holds 32 T.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T t = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += shared[w];
  return t;
}
template <typename T>
__device__ inline T block_max(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T t = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) t = max(t, shared[w]);
  return t;
}

// Philox4x32-10, lane `index & 3` of block index >> 2 of `stream`, as 24-bit uniform in [0, 1).
__device__ inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint64_t c_lo = index >> 2;
  uint32_t c0 = static_cast<uint32_t>(c_lo), c1 = static_cast<uint32_t>(c_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Selected without an indexed array, which would live in local memory.
  const uint32_t lane = (index & 2) ? ((index & 1) ? c3 : c2) : ((index & 1) ? c1 : c0);
  return static_cast<float>(lane >> 8) * (1.0f / 16777216.0f);
}

// bf16 <-> f32 as core/dtype.h: round to nearest even, NaN kept quiet.
__device__ inline float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return static_cast<uint16_t>((u >> 16) | 0x40);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// f16 <-> f32 as the host's IEEE conversions (F16C and GCC's _Float16): round to nearest even,
// overflow to infinity, subnormals, NaN quieted with its payload's top bits kept (CUDA's own
// intrinsics return a canonical NaN instead).
__device__ inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0) {  // zero or subnormal: m 2^-24, exact in f32
    return __uint_as_float(sign | __float_as_uint(static_cast<float>(m) * 5.9604644775390625e-8f));
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal (or the smallest normal) of f16
    const float scaled = __uint_as_float(abs) * 16777216.0f;  // exact: a power of two
    return static_cast<uint16_t>(sign | __float2uint_rn(scaled));
  }
  uint32_t r = abs - 0x38000000u;  // rebias the exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

}  // namespace megatron::cuda
