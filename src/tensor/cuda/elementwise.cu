// Elementwise kernels, per-row scalars, dropout, the optimizer step and the reductions that
// return a number to the host. One thread per element, grid-stride loops; reductions sum fixed
// chunks per block and the chunk sums in order, so that results do not depend on timing.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/cuda/common.cuh"

namespace megatron::cuda {
namespace {

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    out[i] = a[i] + b[i];
  }
}
template <typename T>
__global__ void add_inplace_kernel(T* out, const T* a, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    out[i] += a[i];
  }
}
template <typename T>
__global__ void mul_kernel(T* out, const T* a, const T* b, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    out[i] = a[i] * b[i];
  }
}
template <typename T>
__global__ void scale_kernel(T* x, T f, int64_t n) {
  MEGATRON_GRID_LOOP(i, n) {
    x[i] *= f;
  }
}
template <typename T>
__device__ inline T sum(T a, T b) {
  return a + b;
}
__device__ inline float4 sum(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Columns across threads (blockIdx.x), rows across blockIdx.y: no division per element.
template <typename V>
__global__ void bias_add_kernel(V* x, const V* bias, int64_t rows, int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const V b = bias[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) x[r * cols + c] = sum(x[r * cols + c], b);
}
template <typename T>
__global__ void scale_rows_kernel(T* x, const T* s, int64_t rows, int64_t cols) {
  MEGATRON_GRID_LOOP(i, rows * cols) {
    x[i] *= s[i / cols];
  }
}
// One warp per row.
template <typename T>
__global__ void row_dots_kernel(T* out, const T* a, const T* b, int64_t rows, int64_t cols) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  double s = 0;
  for (int64_t c = lane; c < cols; c += 32)
    s += static_cast<double>(a[r * cols + c]) * b[r * cols + c];
  s = warp_sum(s);
  if (lane == 0) out[r] = static_cast<T>(s);
}

// Column sums in two passes: partial[chunk, c] over kRowChunk rows, then the chunks in order.
constexpr int64_t kRowChunk = 64;
template <typename T>
__global__ void column_partial_kernel(T* partial, const T* x, int64_t rows, int64_t cols) {
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  MEGATRON_GRID_LOOP(i, chunks * cols) {
    const int64_t ch = i / cols, c = i % cols;
    const int64_t r1 = min(rows, (ch + 1) * kRowChunk);
    T s = 0;
    for (int64_t r = ch * kRowChunk; r < r1; ++r) s += x[r * cols + c];
    partial[i] = s;
  }
}
template <typename T>
__global__ void column_finish_kernel(T* out, const T* partial, int64_t chunks, int64_t cols) {
  MEGATRON_GRID_LOOP(c, cols) {
    T s = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) s += partial[ch * cols + c];
    out[c] += s;
  }
}

template <typename T>
__device__ inline T gelu_exact(T v) {
  return T(0.5) * v * (T(1) + erf(v * T(0.70710678118654752440)));
}
template <typename T>
__device__ inline T gelu_tanh(T v) {
  const T k = T(0.79788456080286535588);  // sqrt(2 / pi)
  return T(0.5) * v * (T(1) + tanh(k * (v + T(0.044715) * v * v * v)));
}

template <typename T>
__device__ inline T activation_value(T v, Activation act) {
  switch (act) {
    case Activation::kGelu:
      return gelu_exact(v);
    case Activation::kGeluTanh:
      return gelu_tanh(v);
    case Activation::kTanh:
      return tanh(v);
    case Activation::kSquaredRelu: {
      const T r = v > T(0) ? v : T(0);
      return r * r;
    }
    case Activation::kQuickGelu:
      return v / (T(1) + exp(T(-1.702) * v));
  }
  return v;
}

// d activation / dx at x = v (for tanh, v is the output y).
template <typename T>
__device__ inline T activation_slope(T v, Activation act) {
  switch (act) {
    case Activation::kGelu:
      return T(0.5) * (T(1) + erf(v * T(0.70710678118654752440))) +
             v * exp(T(-0.5) * v * v) * T(0.39894228040143267794);  // 1 / sqrt(2 pi)
    case Activation::kGeluTanh: {
      const T k = T(0.79788456080286535588);
      const T u = k * (v + T(0.044715) * v * v * v);
      const T du = k * (T(1) + T(3 * 0.044715) * v * v);
      const T t = tanh(u);
      return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du;
    }
    case Activation::kTanh:
      return T(1) - v * v;
    case Activation::kSquaredRelu:
      return v > T(0) ? T(2) * v : T(0);
    case Activation::kQuickGelu: {
      const T s = T(1) / (T(1) + exp(T(-1.702) * v));
      return s + T(1.702) * v * s * (T(1) - s);
    }
  }
  return T(0);
}

template <typename T>
__global__ void activation_forward_kernel(T* out, const T* x, int64_t n, Activation act) {
  MEGATRON_GRID_LOOP(i, n) {
    out[i] = activation_value(x[i], act);
  }
}

template <typename T>
__global__ void activation_backward_kernel(T* dx, const T* dout, const T* x, int64_t n,
                                           Activation act) {
  MEGATRON_GRID_LOOP(i, n) {
    dx[i] = dout[i] * activation_slope(x[i], act);
  }
}

// f32 over float4 (n a multiple of 4, every pointer 16-byte aligned): a thread's 4-byte loads
// keep too few bytes in flight to reach HBM bandwidth (about 1.6 of 4.3 TB/s on an H200); 16-byte
// loads do. Same arithmetic per element as the scalar kernels.
__global__ void add4_kernel(float4* out, const float4* a, const float4* b, int64_t n4) {
  MEGATRON_GRID_LOOP(i, n4) {
    out[i] = sum(a[i], b[i]);
  }
}
__global__ void add_inplace4_kernel(float4* out, const float4* a, int64_t n4) {
  MEGATRON_GRID_LOOP(i, n4) {
    out[i] = sum(out[i], a[i]);
  }
}
__global__ void activation_forward4_kernel(float4* out, const float4* x, int64_t n4,
                                           Activation act) {
  MEGATRON_GRID_LOOP(i, n4) {
    const float4 v = x[i];
    out[i] = make_float4(activation_value(v.x, act), activation_value(v.y, act),
                         activation_value(v.z, act), activation_value(v.w, act));
  }
}
__global__ void activation_backward4_kernel(float4* dx, const float4* dout, const float4* x,
                                            int64_t n4, Activation act) {
  MEGATRON_GRID_LOOP(i, n4) {
    const float4 v = x[i], d = dout[i];
    dx[i] = make_float4(d.x * activation_slope(v.x, act), d.y * activation_slope(v.y, act),
                        d.z * activation_slope(v.z, act), d.w * activation_slope(v.w, act));
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
__device__ inline T sigmoid(T g) {
  return T(1) / (T(1) + exp(-g));
}
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* x, int64_t rows, int64_t f) {
  MEGATRON_GRID_LOOP(i, rows * f) {
    const int64_t r = i / f, c = i % f;
    const T g = x[r * 2 * f + c], u = x[r * 2 * f + f + c];
    out[i] = g * sigmoid(g) * u;
  }
}
template <typename T>
__global__ void swiglu_backward_kernel(T* dx, const T* dout, const T* x, int64_t rows, int64_t f) {
  MEGATRON_GRID_LOOP(i, rows * f) {
    const int64_t r = i / f, c = i % f;
    const T g = x[r * 2 * f + c], u = x[r * 2 * f + f + c], s = sigmoid(g);
    dx[r * 2 * f + c] = dout[i] * u * s * (T(1) + g * (T(1) - s));
    dx[r * 2 * f + f + c] = dout[i] * g * s;
  }
}

// quick_geglu (ops.h): the clamps apply where clamp > 0.
template <typename T>
__global__ void quick_geglu_forward_kernel(T* out, const T* x, int64_t rows, int64_t f, T offset,
                                           T clamp) {
  MEGATRON_GRID_LOOP(i, rows * f) {
    const int64_t r = i / f, c = i % f;
    T g = x[r * 2 * f + c], u = x[r * 2 * f + f + c];
    if (clamp > T(0)) {
      g = min(g, clamp);
      u = max(min(u, clamp), -clamp);
    }
    out[i] = g * sigmoid(T(1.702) * g) * (u + offset);
  }
}
template <typename T>
__global__ void quick_geglu_backward_kernel(T* dx, const T* dout, const T* x, int64_t rows,
                                            int64_t f, T offset, T clamp) {
  MEGATRON_GRID_LOOP(i, rows * f) {
    const int64_t r = i / f, c = i % f;
    const T g0 = x[r * 2 * f + c], u0 = x[r * 2 * f + f + c];
    const bool on = clamp > T(0);
    const T g = on ? min(g0, clamp) : g0, u = on ? max(min(u0, clamp), -clamp) : u0;
    const T s = sigmoid(T(1.702) * g);
    const bool gate_free = !on || g0 <= clamp, up_free = !on || (u0 >= -clamp && u0 <= clamp);
    dx[r * 2 * f + c] =
        gate_free ? dout[i] * (u + offset) * (s + T(1.702) * g * s * (T(1) - s)) : T(0);
    dx[r * 2 * f + f + c] = up_free ? dout[i] * g * s : T(0);
  }
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* x, int64_t n, float p, T scale, uint64_t seed,
                               uint64_t stream, uint64_t offset) {
  MEGATRON_GRID_LOOP(i, n) {
    const bool keep = philox_uniform(seed, stream, offset + static_cast<uint64_t>(i)) >= p;
    out[i] = keep ? x[i] * scale : T(0);
  }
}

template <typename T>
struct AdamCoefficients {
  T lr, b1, b2, eps, wd, gs, inv_bc1, inv_sqrt_bc2;
};
template <typename T>
__device__ inline void adam_one(T& p, T& m, T& v, T g, const AdamCoefficients<T>& c) {
  const T gi = g * c.gs;
  m = c.b1 * m + (T(1) - c.b1) * gi;
  v = c.b2 * v + (T(1) - c.b2) * gi * gi;
  const T update = (m * c.inv_bc1) / (sqrt(v) * c.inv_sqrt_bc2 + c.eps) + c.wd * p;
  p -= c.lr * update;
}
template <typename T>
__global__ void adamw_kernel(T* p, T* m, T* v, const T* g, int64_t n, AdamCoefficients<T> c) {
  MEGATRON_GRID_LOOP(i, n) {
    T pi = p[i], mi = m[i], vi = v[i];
    adam_one(pi, mi, vi, g[i], c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}
__global__ void adamw4_kernel(float4* p, float4* m, float4* v, const float4* g, int64_t n4,
                              AdamCoefficients<float> c) {
  MEGATRON_GRID_LOOP(i, n4) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adam_one(pi.x, mi.x, vi.x, gi.x, c);
    adam_one(pi.y, mi.y, vi.y, gi.y, c);
    adam_one(pi.z, mi.z, vi.z, gi.z, c);
    adam_one(pi.w, mi.w, vi.w, gi.w, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// FusedSGD's per-element rule (ops::sgd_step): decay into the gradient, the buffer (a copy on its
// first step), the weight moved by lr times it.
template <typename T>
__global__ void sgd_kernel(T* p, T* buf, const T* g, int64_t n, T lr, T mu, T wd, T gs,
                           bool first) {
  MEGATRON_GRID_LOOP(i, n) {
    const T gi = g[i] * gs;  // rounded, as clipping in place leaves it
    T d = fma(wd, p[i], gi);
    if (buf) {
      if (!first) d = buf[i] * mu + d;
      buf[i] = d;
    }
    p[i] = fma(-lr, d, p[i]);
  }
}

// Lion's per-element rule (ops::lion_step): torch's lerp and add_ as explicit fused multiply-adds.
template <typename T>
__device__ T lerp_torch(T a, T b, T w) {
  const T diff = b - a;
  return w < T(0.5) ? fma(w, diff, a) : fma(-diff, T(1) - w, b);
}
template <typename T>
__global__ void lion_kernel(T* p, T* m, const T* g, int64_t n, T lr, T w1, T w2, T decay, T gs) {
  MEGATRON_GRID_LOOP(i, n) {
    const T gi = g[i] * gs;
    const T w = fma(decay, p[i], p[i]);
    const T u = lerp_torch(m[i], gi, w1);
    m[i] = lerp_torch(m[i], gi, w2);
    const T s = isnan(u) ? u : static_cast<T>((u > T(0)) - (u < T(0)));
    p[i] = fma(-lr, s, w);
  }
}

// Reductions: block b sums elements [b * chunk, (b + 1) * chunk) into partial[b].
constexpr int64_t kReduceChunk = 16384;
template <typename T>
__global__ void sum_squares_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double shared[32];
  const int64_t begin = blockIdx.x * kReduceChunk, end = min(n, begin + kReduceChunk);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <typename T>
__global__ void count_zeros_kernel(long long* partial, const T* x, int64_t n) {
  __shared__ long long shared[32];
  const int64_t begin = blockIdx.x * kReduceChunk, end = min(n, begin + kReduceChunk);
  long long s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    s += static_cast<float>(x[i]) == 0.0f;
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <typename T>
__global__ void masked_sum_kernel(double* partial, const T* loss, const float* mask, int64_t n) {
  __shared__ double shared[32];
  const int64_t begin = blockIdx.x * kReduceChunk, end = min(n, begin + kReduceChunk);
  double s = 0, c = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    s += static_cast<double>(loss[i]) * mask[i];
    c += mask[i];
  }
  s = block_sum(s, shared);
  c = block_sum(c, shared);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = s;
    partial[2 * blockIdx.x + 1] = c;
  }
}

int64_t reduce_blocks(int64_t n) {
  return (n + kReduceChunk - 1) / kReduceChunk;
}

// The blocks' partial results of a reduction, read back to the host (which adds them in block
// order: the result does not depend on which block finished first).
template <typename P>
std::vector<P> partials_on_host(const P* partial, int64_t n) {
  std::vector<P> host(static_cast<size_t>(n));
  copy_to_host(host.data(), partial, sizeof(P) * n);
  return host;
}

}  // namespace

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
      add4_kernel<<<blocks_for(n / 4), kThreads>>>(reinterpret_cast<float4*>(out),
                                                   reinterpret_cast<const float4*>(a),
                                                   reinterpret_cast<const float4*>(b), n / 4);
      check_launch("add");
      return;
    }
  }
  add_kernel<<<blocks_for(n), kThreads>>>(out, a, b, n);
  check_launch("add");
}
template <typename T>
void add_inplace(T* out, const T* a, int64_t n) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(out) && aligned16(a)) {
      add_inplace4_kernel<<<blocks_for(n / 4), kThreads>>>(
          reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a), n / 4);
      check_launch("add_inplace");
      return;
    }
  }
  add_inplace_kernel<<<blocks_for(n), kThreads>>>(out, a, n);
  check_launch("add_inplace");
}
template <typename T>
void mul(T* out, const T* a, const T* b, int64_t n) {
  if (n == 0) return;
  mul_kernel<<<blocks_for(n), kThreads>>>(out, a, b, n);
  check_launch("mul");
}
template <typename T>
void scale(T* x, double factor, int64_t n) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads>>>(x, static_cast<T>(factor), n);
  check_launch("scale_inplace");
}
template <typename T>
void bias_add(T* x, const T* bias, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  const unsigned row_blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  if constexpr (std::is_same_v<T, float>) {
    if (cols % 4 == 0 && aligned16(x) && aligned16(bias)) {
      const int64_t c4 = cols / 4;
      const dim3 grid(static_cast<unsigned>((c4 + kThreads - 1) / kThreads), row_blocks);
      bias_add_kernel<<<grid, kThreads>>>(reinterpret_cast<float4*>(x),
                                          reinterpret_cast<const float4*>(bias), rows, c4);
      check_launch("bias_add");
      return;
    }
  }
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads), row_blocks);
  bias_add_kernel<<<grid, kThreads>>>(x, bias, rows, cols);
  check_launch("bias_add");
}
template <typename T>
void column_sums_accumulate(T* out, const T* x, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  T* partial = static_cast<T*>(workspace(sizeof(T) * chunks * cols, 0));
  column_partial_kernel<<<blocks_for(chunks * cols), kThreads>>>(partial, x, rows, cols);
  column_finish_kernel<<<blocks_for(cols), kThreads>>>(out, partial, chunks, cols);
  check_launch("column sums");
}
template <typename T>
void scale_rows(T* x, const T* s, int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  scale_rows_kernel<<<blocks_for(rows * cols), kThreads>>>(x, s, rows, cols);
  check_launch("scale_rows");
}
template <typename T>
void row_dots(T* out, const T* a, const T* b, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  row_dots_kernel<<<blocks_for(rows * 32), kThreads>>>(out, a, b, rows, cols);
  check_launch("row_dots");
}
template <typename T>
void activation_forward(T* out, const T* x, int64_t n, Activation act) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(out) && aligned16(x)) {
      activation_forward4_kernel<<<blocks_for(n / 4), kThreads>>>(
          reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(x), n / 4, act);
      check_launch("activation forward");
      return;
    }
  }
  activation_forward_kernel<<<blocks_for(n), kThreads>>>(out, x, n, act);
  check_launch("activation forward");
}
template <typename T>
void activation_backward(T* dx, const T* dout, const T* x, int64_t n, Activation act) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x)) {
      activation_backward4_kernel<<<blocks_for(n / 4), kThreads>>>(
          reinterpret_cast<float4*>(dx), reinterpret_cast<const float4*>(dout),
          reinterpret_cast<const float4*>(x), n / 4, act);
      check_launch("activation backward");
      return;
    }
  }
  activation_backward_kernel<<<blocks_for(n), kThreads>>>(dx, dout, x, n, act);
  check_launch("activation backward");
}
template <typename T>
void sgd(T* p, T* buf, const T* g, int64_t n, const SgdArgs& a) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads>>>(
      p, buf, g, n, static_cast<T>(a.lr), static_cast<T>(a.momentum),
      static_cast<T>(a.weight_decay), static_cast<T>(a.grad_scale), a.first);
  check_launch("sgd_step");
}
template <typename T>
void lion(T* p, T* m, const T* g, int64_t n, const LionArgs& a) {
  if (n == 0) return;
  lion_kernel<<<blocks_for(n), kThreads>>>(p, m, g, n, static_cast<T>(a.lr),
                                           static_cast<T>(a.weight1), static_cast<T>(a.weight2),
                                           static_cast<T>(a.decay), static_cast<T>(a.grad_scale));
  check_launch("lion_step");
}
template <typename T>
void swiglu_forward(T* out, const T* x, int64_t rows, int64_t f) {
  if (rows * f == 0) return;
  swiglu_forward_kernel<<<blocks_for(rows * f), kThreads>>>(out, x, rows, f);
  check_launch("swiglu_forward");
}
template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int64_t rows, int64_t f) {
  if (rows * f == 0) return;
  swiglu_backward_kernel<<<blocks_for(rows * f), kThreads>>>(dx, dout, x, rows, f);
  check_launch("swiglu_backward");
}
template <typename T>
void quick_geglu_forward(T* out, const T* x, int64_t rows, int64_t f, double offset, double clamp) {
  if (rows * f == 0) return;
  quick_geglu_forward_kernel<<<blocks_for(rows * f), kThreads>>>(
      out, x, rows, f, static_cast<T>(offset), static_cast<T>(clamp));
  check_launch("quick_geglu_forward");
}
template <typename T>
void quick_geglu_backward(T* dx, const T* dout, const T* x, int64_t rows, int64_t f, double offset,
                          double clamp) {
  if (rows * f == 0) return;
  quick_geglu_backward_kernel<<<blocks_for(rows * f), kThreads>>>(
      dx, dout, x, rows, f, static_cast<T>(offset), static_cast<T>(clamp));
  check_launch("quick_geglu_backward");
}
template <typename T>
void dropout(T* out, const T* x, int64_t n, float p, uint64_t seed, uint64_t stream,
             uint64_t offset) {
  if (n == 0) return;
  const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(p)));
  dropout_kernel<<<blocks_for(n), kThreads>>>(out, x, n, p, scale, seed, stream, offset);
  check_launch("dropout");
}
template <typename T>
void adamw(T* p, T* m, T* v, const T* g, int64_t n, const AdamArgs& a) {
  if (n == 0) return;
  const AdamCoefficients<T> c{static_cast<T>(a.lr),           static_cast<T>(a.beta1),
                              static_cast<T>(a.beta2),        static_cast<T>(a.eps),
                              static_cast<T>(a.weight_decay), static_cast<T>(a.grad_scale),
                              static_cast<T>(a.inv_bc1),      static_cast<T>(a.inv_sqrt_bc2)};
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(p) && aligned16(m) && aligned16(v) && aligned16(g)) {
      adamw4_kernel<<<blocks_for(n / 4), kThreads>>>(
          reinterpret_cast<float4*>(p), reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v),
          reinterpret_cast<const float4*>(g), n / 4, c);
      check_launch("adamw_step");
      return;
    }
  }
  adamw_kernel<<<blocks_for(n), kThreads>>>(p, m, v, g, n, c);
  check_launch("adamw_step");
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
  if (n == 0) return 0;
  const int64_t nb = reduce_blocks(n);
  double* partial = static_cast<double*>(workspace(sizeof(double) * nb, 1));
  sum_squares_kernel<<<static_cast<unsigned>(nb), kThreads>>>(partial, x, n);
  check_launch("sum_squares");
  double total = 0;
  for (double h : partials_on_host(partial, nb)) total += h;
  return total;
}
template <typename T>
int64_t count_zeros(const T* x, int64_t n) {
  if (n == 0) return 0;
  const int64_t nb = reduce_blocks(n);
  long long* partial = static_cast<long long*>(workspace(sizeof(long long) * nb, 1));
  count_zeros_kernel<<<static_cast<unsigned>(nb), kThreads>>>(partial, x, n);
  check_launch("count_zeros");
  int64_t total = 0;
  for (long long h : partials_on_host(partial, nb)) total += h;
  return total;
}
template <typename T>
void masked_sum(const T* loss, const float* mask, int64_t n, double* sum, double* count) {
  *sum = *count = 0;
  if (n == 0) return;
  const int64_t nb = reduce_blocks(n);
  double* partial = static_cast<double*>(workspace(sizeof(double) * 2 * nb, 1));
  masked_sum_kernel<<<static_cast<unsigned>(nb), kThreads>>>(partial, loss, mask, n);
  check_launch("masked_sum");
  const std::vector<double> host = partials_on_host(partial, 2 * nb);
  for (int64_t b = 0; b < nb; ++b) {
    *sum += host[2 * b];
    *count += host[2 * b + 1];
  }
}

#define MEGATRON_INSTANTIATE(T)                                                                    \
  template void add<T>(T*, const T*, const T*, int64_t);                                           \
  template void add_inplace<T>(T*, const T*, int64_t);                                             \
  template void mul<T>(T*, const T*, const T*, int64_t);                                           \
  template void scale<T>(T*, double, int64_t);                                                     \
  template void bias_add<T>(T*, const T*, int64_t, int64_t);                                       \
  template void column_sums_accumulate<T>(T*, const T*, int64_t, int64_t);                         \
  template void scale_rows<T>(T*, const T*, int64_t, int64_t);                                     \
  template void row_dots<T>(T*, const T*, const T*, int64_t, int64_t);                             \
  template void activation_forward<T>(T*, const T*, int64_t, Activation);                          \
  template void activation_backward<T>(T*, const T*, const T*, int64_t, Activation);               \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);                                 \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);                      \
  template void quick_geglu_forward<T>(T*, const T*, int64_t, int64_t, double, double);            \
  template void quick_geglu_backward<T>(T*, const T*, const T*, int64_t, int64_t, double, double); \
  template void dropout<T>(T*, const T*, int64_t, float, uint64_t, uint64_t, uint64_t);            \
  template void adamw<T>(T*, T*, T*, const T*, int64_t, const AdamArgs&);                          \
  template void sgd<T>(T*, T*, const T*, int64_t, const SgdArgs&);                                 \
  template void lion<T>(T*, T*, const T*, int64_t, const LionArgs&);                               \
  template double sum_squares<T>(const T*, int64_t);                                               \
  template int64_t count_zeros<T>(const T*, int64_t);                                              \
  template void masked_sum<T>(const T*, const float*, int64_t, double*, double*);
MEGATRON_INSTANTIATE(float)
MEGATRON_INSTANTIATE(double)
#undef MEGATRON_INSTANTIATE

}  // namespace megatron::cuda
