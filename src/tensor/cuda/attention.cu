// Attention with an online softmax (flash-attention's recurrence, on CUDA cores): memory linear in
// the lengths, the per-row log-sum-exp kept for backward, every mask kind, an additive bias, GQA
// and counter-based dropout (the same Philox counters as the other devices).
//
// Forward and the dq pass: a block of kWarps warps takes kWarps query rows of one (batch, head);
// the block loads tiles of 32 keys (and values) into shared memory, lane j of each warp scores
// key j of the tile against its row, and each lane accumulates hn / 32 output channels. The dk/dv
// pass swaps the roles: a warp per key row of one key/value head, looping over the query rows of
// every query head that reads it, so each dk, dv element has one writer (deterministic, no
// atomics). dq, dk and dv are written through their views (strides into a packed QKV gradient).
#include <cmath>
#include <type_traits>

#include "tensor/cuda/attention_common.cuh"

namespace megatron::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTile = 32;
constexpr int kMaxPerLane = 8;  // hn <= 256

template <typename T>
__device__ inline T bias_at(const T* bias, const AttnArgs& a, int64_t bb, int64_t h, int64_t i,
                            int64_t j) {
  if (!bias) return T(0);
  const int64_t bsel = a.bias_batches == 1 ? 0 : bb;
  return bias[((bsel * a.np + h) * a.q.s + i) * a.k.s + j];
}

// Loads rows [r0, r0 + kTile) of a view (one head) into tile[kTile][hn]; rows past s are zeros.
template <typename T>
__device__ inline void load_tile(T* tile, const T* base, const AttnView& v, int64_t r0, int64_t bb,
                                 int64_t head) {
  const int64_t hn = v.hn;
  for (int64_t e = threadIdx.x; e < kTile * hn; e += blockDim.x) {
    const int64_t r = e / hn, c = e % hn;
    tile[e] = r0 + r < v.s ? base[view_at(v, r0 + r, bb, head) + c] : T(0);
  }
}

template <typename T>
__device__ inline T dot_row(const T* a, const T* b, int64_t hn) {
  T s = 0;
  for (int64_t c = 0; c < hn; ++c) s += a[c] * b[c];
  return s;
}

template <typename T>
__global__ void forward_kernel(T* out, T* lse, const T* q, const T* k, const T* v, const T* bias,
                               AttnArgs a) {
  extern __shared__ unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int64_t hn = a.q.hn, sq = a.q.s, skv = a.k.s;
  T* qrow = smem + (threadIdx.x >> 5) * hn;
  T* ktile = smem + kWarps * hn;
  T* vtile = ktile + kTile * hn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bb = blockIdx.y / a.np, h = blockIdx.y % a.np, kvh = h / (a.np / a.ng);
  const int64_t i0 = blockIdx.x * static_cast<int64_t>(kWarps), i = i0 + warp;
  for (int64_t c = lane; c < hn; c += 32) qrow[c] = i < sq ? q[view_at(a.q, i, bb, h) + c] : T(0);
  T m = -INFINITY, l = 0, acc[kMaxPerLane];
  for (int t = 0; t < kMaxPerLane; ++t) acc[t] = 0;
  // Causal: no row of this block sees a key past its last row's position.
  int64_t kv_end = skv;
  if (a.causal) {
    const int64_t last = min(sq - 1, i0 + kWarps - 1) + a.q_offset - a.kv_offset + 1;
    kv_end = last < 0 ? 0 : (last < skv ? last : skv);
  }
  for (int64_t j0 = 0; j0 < kv_end; j0 += kTile) {
    __syncthreads();
    load_tile(ktile, k, a.k, j0, bb, kvh);
    load_tile(vtile, v, a.v, j0, bb, kvh);
    __syncthreads();
    const int64_t j = j0 + lane;
    const bool vis = visible(a, bb, i, j);
    const T s = vis ? dot_row(qrow, ktile + lane * hn, hn) * static_cast<T>(a.scale) +
                          bias_at(bias, a, bb, h, i, j)
                    : T(-INFINITY);
    const T new_m = max(m, warp_max(s));
    if (new_m == T(-INFINITY)) continue;  // nothing visible yet
    const T p = vis ? exp(s - new_m) : T(0);
    const T corr = exp(m - new_m);
    l = l * corr + warp_sum(p);
    const T pd = vis ? p * keep_scale<T>(a, bb, h, i, j) : T(0);
    for (int t = 0; t < kMaxPerLane; ++t) acc[t] *= corr;
    for (int jj = 0; jj < kTile; ++jj) {
      const T pj = __shfl_sync(0xffffffffu, pd, jj);
      if (pj == T(0)) continue;
      for (int t = 0; t < kMaxPerLane; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < hn) acc[t] += pj * vtile[jj * hn + c];
      }
    }
    m = new_m;
  }
  if (i >= sq) return;
  T* o = out + ((i * a.q.b + bb) * a.np + h) * hn;
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < hn) o[c] = l > T(0) ? acc[t] / l : T(0);
  }
  if (lane == 0) lse[(bb * a.np + h) * sq + i] = l > T(0) ? m + log(l) : T(-INFINITY);
  if (lane == 0 && l > T(0)) raise_max_logit(a, h, static_cast<float>(m));
}

// delta[bb, h, i] = dout_i . out_i (the row sum of P dP over every key).
template <typename T>
__global__ void delta_kernel(T* delta, const T* dout, const T* out, AttnArgs a) {
  const int64_t rows = a.q.s * a.q.b * a.np, hn = a.q.hn;
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  T s = 0;
  for (int64_t c = lane; c < hn; c += 32) s += dout[r * hn + c] * out[r * hn + c];
  s = warp_sum(s);
  // r = (i * b + bb) * np + h
  const int64_t h = r % a.np, bb = (r / a.np) % a.q.b, i = r / (a.np * a.q.b);
  if (lane == 0) delta[(bb * a.np + h) * a.q.s + i] = s;
}

template <typename T>
__device__ inline T prob(T s, T row_lse) {
  return row_lse == T(-INFINITY) ? T(0) : exp(s - row_lse);
}

template <typename T>
__global__ void dq_kernel(T* dq, T* dbias, const T* delta, const T* dout, const T* q, const T* k,
                          const T* v, const T* lse, const T* bias, AttnArgs a) {
  extern __shared__ unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int64_t hn = a.q.hn, sq = a.q.s, skv = a.k.s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* qrow = smem + warp * hn;
  T* dorow = smem + (kWarps + warp) * hn;
  T* ktile = smem + 2 * kWarps * hn;
  T* vtile = ktile + kTile * hn;
  const int64_t bb = blockIdx.y / a.np, h = blockIdx.y % a.np, kvh = h / (a.np / a.ng);
  const int64_t i = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  for (int64_t c = lane; c < hn; c += 32) {
    qrow[c] = i < sq ? q[view_at(a.q, i, bb, h) + c] : T(0);
    dorow[c] = i < sq ? dout[((i * a.q.b + bb) * a.np + h) * hn + c] : T(0);
  }
  const T row_lse = i < sq ? lse[(bb * a.np + h) * sq + i] : T(-INFINITY);
  const T row_delta = i < sq ? delta[(bb * a.np + h) * sq + i] : T(0);
  T acc[kMaxPerLane];
  for (int t = 0; t < kMaxPerLane; ++t) acc[t] = 0;
  for (int64_t j0 = 0; j0 < skv; j0 += kTile) {
    __syncthreads();
    load_tile(ktile, k, a.k, j0, bb, kvh);
    load_tile(vtile, v, a.v, j0, bb, kvh);
    __syncthreads();
    const int64_t j = j0 + lane;
    const bool vis = visible(a, bb, i, j);
    T ds = 0;
    if (vis) {
      const T s = dot_row(qrow, ktile + lane * hn, hn) * static_cast<T>(a.scale) +
                  bias_at(bias, a, bb, h, i, j);
      const T p = prob(s, row_lse);
      const T dp = keep_scale<T>(a, bb, h, i, j) * dot_row(dorow, vtile + lane * hn, hn);
      ds = p * (dp - row_delta);
    }
    if (dbias && i < sq && j < skv) dbias[((bb * a.np + h) * sq + i) * skv + j] = ds;
    for (int jj = 0; jj < kTile; ++jj) {
      const T dj = __shfl_sync(0xffffffffu, ds, jj);
      if (dj == T(0)) continue;
      for (int t = 0; t < kMaxPerLane; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < hn) acc[t] += dj * ktile[jj * hn + c];
      }
    }
  }
  if (i >= sq) return;
  T* d = dq + view_at(a.dq, i, bb, h);
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < hn) d[c] = acc[t] * static_cast<T>(a.scale);
  }
}

template <typename T>
__global__ void dkv_kernel(T* dk, T* dv, const T* delta, const T* dout, const T* q, const T* k,
                           const T* v, const T* lse, const T* bias, AttnArgs a) {
  extern __shared__ unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int64_t hn = a.q.hn, sq = a.q.s, skv = a.k.s, qpg = a.np / a.ng;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* krow = smem + warp * hn;
  T* vrow = smem + (kWarps + warp) * hn;
  T* qtile = smem + 2 * kWarps * hn;
  T* dotile = qtile + kTile * hn;
  const int64_t bb = blockIdx.y / a.ng, kvh = blockIdx.y % a.ng;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  for (int64_t c = lane; c < hn; c += 32) {
    krow[c] = j < skv ? k[view_at(a.k, j, bb, kvh) + c] : T(0);
    vrow[c] = j < skv ? v[view_at(a.v, j, bb, kvh) + c] : T(0);
  }
  T dk_acc[kMaxPerLane], dv_acc[kMaxPerLane];
  for (int t = 0; t < kMaxPerLane; ++t) dk_acc[t] = dv_acc[t] = 0;
  for (int64_t h = kvh * qpg; h < (kvh + 1) * qpg; ++h) {
    for (int64_t i0 = 0; i0 < sq; i0 += kTile) {
      __syncthreads();
      load_tile(qtile, q, a.q, i0, bb, h);
      for (int64_t e = threadIdx.x; e < kTile * hn; e += blockDim.x) {
        const int64_t r = e / hn, c = e % hn;
        dotile[e] = i0 + r < sq ? dout[(((i0 + r) * a.q.b + bb) * a.np + h) * hn + c] : T(0);
      }
      __syncthreads();
      const int64_t i = i0 + lane;
      const bool vis = visible(a, bb, i, j);
      T pk = 0, ds = 0;
      if (vis) {
        const T s = dot_row(qtile + lane * hn, krow, hn) * static_cast<T>(a.scale) +
                    bias_at(bias, a, bb, h, i, j);
        const T p = prob(s, lse[(bb * a.np + h) * sq + i]);
        const T keep = keep_scale<T>(a, bb, h, i, j);
        const T dp = keep * dot_row(dotile + lane * hn, vrow, hn);
        pk = p * keep;
        ds = p * (dp - delta[(bb * a.np + h) * sq + i]);
      }
      for (int ii = 0; ii < kTile; ++ii) {
        const T pi = __shfl_sync(0xffffffffu, pk, ii), di = __shfl_sync(0xffffffffu, ds, ii);
        if (pi == T(0) && di == T(0)) continue;
        for (int t = 0; t < kMaxPerLane; ++t) {
          const int64_t c = lane + 32 * t;
          if (c < hn) {
            dv_acc[t] += pi * dotile[ii * hn + c];
            dk_acc[t] += di * qtile[ii * hn + c];
          }
        }
      }
    }
  }
  if (j >= skv) return;
  T* dkp = dk + view_at(a.dk, j, bb, kvh);
  T* dvp = dv + view_at(a.dv, j, bb, kvh);
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < hn) {
      dkp[c] = dk_acc[t] * static_cast<T>(a.scale);
      dvp[c] = dv_acc[t];
    }
  }
}

template <typename T>
__global__ void merge_kernel(T* out, T* lse, const T* out_b, const T* lse_b, int64_t sq, int64_t b,
                             int64_t np, int64_t hn) {
  MEGATRON_GRID_LOOP(r, sq * b * np) {
    // r = (i * b + bb) * np + h
    const int64_t h = r % np, bb = (r / np) % b, i = r / (np * b);
    T* l = lse + (bb * np + h) * sq + i;
    const T lb = lse_b[(bb * np + h) * sq + i];
    T* o = out + r * hn;
    const T* ob = out_b + r * hn;
    const T m = max(*l, lb);
    if (m == T(-INFINITY)) {
      for (int64_t c = 0; c < hn; ++c) o[c] = 0;
      continue;
    }
    const T merged = m + log(exp(*l - m) + exp(lb - m));
    const T fa = exp(*l - merged), fb = exp(lb - merged);
    for (int64_t c = 0; c < hn; ++c) o[c] = fa * o[c] + fb * ob[c];
    *l = merged;
  }
}

// Attention sinks (ops::attention_sink_forward): row r = (i * b + bb) * np + h.
template <typename T>
__global__ void sink_forward_kernel(T* out, T* lse, const T* sink, int64_t sq, int64_t b,
                                    int64_t np, int64_t hn) {
  MEGATRON_GRID_LOOP(r, sq * b * np) {
    const int64_t h = r % np, bb = (r / np) % b, i = r / (np * b);
    T* l = lse + (bb * np + h) * sq + i;
    const T m = max(*l, sink[h]);
    const T merged = m + log(exp(*l - m) + exp(sink[h] - m));
    const T f = exp(*l - merged);
    for (int64_t c = 0; c < hn; ++c) out[r * hn + c] *= f;
    *l = merged;
  }
}

// One block per head: the sink's gradient summed over the head's rows (a tree in shared memory).
template <typename T>
__global__ void sink_backward_kernel(T* dsink, const T* dout, const T* out, const T* lse,
                                     const T* sink, int64_t sq, int64_t b, int64_t np, int64_t hn) {
  __shared__ double partial[kThreads];
  const int64_t h = blockIdx.x;
  double acc = 0;
  for (int64_t n = threadIdx.x; n < sq * b; n += blockDim.x) {
    const int64_t i = n / b, bb = n % b;
    const int64_t at = ((i * b + bb) * np + h) * hn;
    double dot = 0;
    for (int64_t c = 0; c < hn; ++c) dot += static_cast<double>(dout[at + c]) * out[at + c];
    acc -= exp(static_cast<double>(sink[h]) - lse[(bb * np + h) * sq + i]) * dot;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[h] = static_cast<T>(partial[0]);
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)) != cudaSuccess) {
      cuda_fail("attention", "head dimension too large for shared memory");
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* bias,
                       const AttnArgs& a) {
  if (a.q.s == 0 || a.q.b == 0 || a.np == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (flash_attention_applies(a, bias != nullptr, q, k, v)) {
      flash_attention_forward(out, lse, q, k, v, a);
      return;
    }
  }
  if (a.q.hn > 32 * kMaxPerLane) cuda_fail("attention_forward", "head dimension above 256");
  const size_t bytes = sizeof(T) * (kWarps + 2 * kTile) * a.q.hn;
  allow_shared(forward_kernel<T>, bytes);
  const dim3 grid(static_cast<unsigned>((a.q.s + kWarps - 1) / kWarps),
                  static_cast<unsigned>(a.q.b * a.np));
  forward_kernel<T><<<grid, kWarps * 32, bytes>>>(out, lse, q, k, v, bias, a);
  check_launch("attention_forward");
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, T* dbias_scratch, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const T* lse, const T* bias,
                        const AttnArgs& a) {
  if (a.q.b == 0 || a.np == 0) return;
  if (a.q.hn > 32 * kMaxPerLane) cuda_fail("attention_backward", "head dimension above 256");
  const int64_t rows = a.q.s * a.q.b * a.np;
  if (rows > 0) {
    delta_kernel<T><<<blocks_for(rows * 32), kThreads>>>(delta, dout, out, a);
    check_launch("attention_backward (delta)");
  }
  if constexpr (std::is_same_v<T, float>) {
    if (flash_attention_applies(a, bias != nullptr, q, k, v, dq, dk, dv, dout)) {
      flash_attention_backward(dq, dk, dv, delta, dout, q, k, v, lse, a);
      return;
    }
  }
  const size_t bytes = sizeof(T) * (2 * kWarps + 2 * kTile) * a.q.hn;
  if (a.q.s > 0) {
    allow_shared(dq_kernel<T>, bytes);
    const dim3 grid(static_cast<unsigned>((a.q.s + kWarps - 1) / kWarps),
                    static_cast<unsigned>(a.q.b * a.np));
    dq_kernel<T>
        <<<grid, kWarps * 32, bytes>>>(dq, dbias_scratch, delta, dout, q, k, v, lse, bias, a);
    check_launch("attention_backward (dq)");
  }
  if (a.k.s > 0) {
    allow_shared(dkv_kernel<T>, bytes);
    const dim3 grid(static_cast<unsigned>((a.k.s + kWarps - 1) / kWarps),
                    static_cast<unsigned>(a.q.b * a.ng));
    dkv_kernel<T><<<grid, kWarps * 32, bytes>>>(dk, dv, delta, dout, q, k, v, lse, bias, a);
    check_launch("attention_backward (dk, dv)");
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int64_t sq, int64_t b,
                     int64_t np, int64_t hn) {
  if (sq * b * np == 0) return;
  merge_kernel<<<blocks_for(sq * b * np), kThreads>>>(out, lse, out_b, lse_b, sq, b, np, hn);
  check_launch("attention_merge");
}

template <typename T>
void attention_sink_forward(T* out, T* lse, const T* sink, int64_t sq, int64_t b, int64_t np,
                            int64_t hn) {
  if (sq * b * np == 0) return;
  sink_forward_kernel<<<blocks_for(sq * b * np), kThreads>>>(out, lse, sink, sq, b, np, hn);
  check_launch("attention_sink_forward");
}

template <typename T>
void attention_sink_backward(T* dsink, const T* dout, const T* out, const T* lse, const T* sink,
                             int64_t sq, int64_t b, int64_t np, int64_t hn) {
  if (np == 0) return;
  sink_backward_kernel<<<static_cast<unsigned>(np), kThreads>>>(dsink, dout, out, lse, sink, sq, b,
                                                                np, hn);
  check_launch("attention_sink_backward");
}

#define MEGATRON_INSTANTIATE(T)                                                                   \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const T*,              \
                                     const AttnArgs&);                                            \
  template void attention_backward<T>(T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                      const T*, const T*, const T*, const AttnArgs&);             \
  template void attention_merge<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t,         \
                                   int64_t);                                                      \
  template void attention_sink_forward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t);  \
  template void attention_sink_backward<T>(T*, const T*, const T*, const T*, const T*, int64_t,   \
                                           int64_t, int64_t, int64_t);
MEGATRON_INSTANTIATE(float)
MEGATRON_INSTANTIATE(double)
#undef MEGATRON_INSTANTIATE

}  // namespace megatron::cuda
