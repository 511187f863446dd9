// LayerNorm and RMSNorm: one block per row for the row statistics (two passes over the row: the
// mean, then the centred variance, as the reference computes them); the weight and bias gradients
// are column sums of per-row terms (a scratch [rows, h] of dout * xhat, then the deterministic
// column sums of elementwise.cu).
#include "tensor/cuda/common.cuh"

namespace megatron::cuda {
namespace {

template <typename T>
__global__ void layernorm_forward_kernel(T* out, T* mean, T* rstd, const T* x, const T* w,
                                         const T* b, int64_t h, float eps) {
  __shared__ T shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * h;
  T s = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += xr[j];
  const T mu = block_sum(s, shared) / static_cast<T>(h);
  T v = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
  const T var = block_sum(v, shared) / static_cast<T>(h);
  const T rs = T(1) / sqrt(var + static_cast<T>(eps));
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    out[r * h + j] = (xr[j] - mu) * rs * w[j] + b[j];
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, T* rstd, const T* x, const T* w, int64_t h,
                                       float eps) {
  __shared__ T shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * h;
  T s = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += xr[j] * xr[j];
  const T rs = T(1) / sqrt(block_sum(s, shared) / static_cast<T>(h) + static_cast<T>(eps));
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) out[r * h + j] = xr[j] * rs * w[j];
}

// xhat = (x - mean) rstd (mean null: RMSNorm, xhat = x rstd), g = dout w:
//   LayerNorm dx = rstd (g - mean(g) - xhat mean(g xhat)),  RMSNorm dx = rstd (g - xhat mean(g
//   xhat)).
// dxhat_out[r, j] = dout xhat, for the weight gradient's column sums.
template <typename T>
__global__ void norm_backward_kernel(T* dx, T* dout_xhat, const T* dout, const T* x, const T* w,
                                     const T* mean, const T* rstd, int64_t h) {
  __shared__ T shared[32];
  const int64_t r = blockIdx.x;
  const T mu = mean ? mean[r] : T(0), rs = rstd[r];
  T sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const T xhat = (x[r * h + j] - mu) * rs, g = dout[r * h + j] * w[j];
    sg += g;
    sgx += g * xhat;
    dout_xhat[r * h + j] = dout[r * h + j] * xhat;
  }
  const T mg = mean ? block_sum(sg, shared) / static_cast<T>(h) : T(0);
  const T mgx = block_sum(sgx, shared) / static_cast<T>(h);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const T xhat = (x[r * h + j] - mu) * rs, g = dout[r * h + j] * w[j];
    dx[r * h + j] = rs * (g - mg - xhat * mgx);
  }
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows,
                       int64_t h, float eps) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(out, mean, rstd, x, w, b, h,
                                                                      eps);
  check_launch("layernorm_forward");
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t rows, int64_t h, float eps) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(out, rstd, x, w, h, eps);
  check_launch("rmsnorm_forward");
}

template <typename T>
void norm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                   const T* rstd, int64_t rows, int64_t h) {
  if (rows == 0) return;
  T* scratch = static_cast<T*>(workspace(sizeof(T) * rows * h, 2));
  norm_backward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(dx, scratch, dout, x, w, mean,
                                                                  rstd, h);
  check_launch("norm backward");
  column_sums_accumulate(dw, static_cast<const T*>(scratch), rows, h);
  if (db) column_sums_accumulate(db, dout, rows, h);
}

#define MEGATRON_INSTANTIATE(T)                                                                  \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                     float);                                                     \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, float);         \
  template void norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,   \
                                 int64_t, int64_t);
MEGATRON_INSTANTIATE(float)
MEGATRON_INSTANTIATE(double)
#undef MEGATRON_INSTANTIATE

}  // namespace megatron::cuda
