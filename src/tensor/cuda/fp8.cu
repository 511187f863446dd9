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

}  // namespace megatron::cuda
