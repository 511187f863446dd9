// Flash attention on the tensor cores (FlashAttention-2's schedule with mma.sync.m16n8k16 bf16
// instructions, sm_80 and later): the same masks, GQA and dropout counters as attention.cu, for
// head dimensions 64 and 128 and no score bias, in bf16 runs (AttentionSpec::precision).
//
// A block is 4 warps; each warp owns 16 rows of a 64-row block (query rows in forward and dq, key
// rows in dk/dv). Operands are read from f32 global memory, rounded to bf16 and staged in shared
// memory, row-major where a fragment reads a row's channels and transposed where it reads along
// the rows; every shared row is padded by 8 bf16 so that the 8 rows one fragment load touches fall
// in different banks. Scores, probabilities and gradients of a tile live in the mma accumulators
// (16 x 8 f32 per warp and instruction: thread t holds rows t/4 and t/4 + 8, columns 2 (t % 4) and
// 2 (t % 4) + 1), and those accumulators become the next product's A fragments without leaving
// registers. The softmax runs in base 2 (scores times scale * log2 e; lse stored in base e).
//
// Backward is deterministic: delta (attention.cu), then one kernel per key block that loops over
// the query rows of every query head reading it (dk, dv: one writer each) and one per query block
// that loops over the keys (dq); both recompute the probabilities from lse.
#include <cuda_bf16.h>

#include <cmath>

#include "tensor/cuda/attention_common.cuh"

namespace megatron::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreadsFa = 128;  // 4 warps
constexpr int kRows = 64;        // rows of a block: 16 per warp
constexpr int kPad = 8;          // bf16 of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The inner tile (keys per step in forward and dq, queries per step in dk/dv): 64, or 32 for
// hn 128, which keeps the accumulators of a warp (rows x hn of dq, or dk and dv) in registers.
template <int D>
constexpr int kInner = D == 128 ? 32 : 64;

__device__ inline uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two floats rounded to bf16 (nearest even), the first in the low half: one A-fragment register.
__device__ inline uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a b for a 16 x 16 bf16 A (row-major fragment), a 16 x 8 bf16 B (column-major), f32 c.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of rows r0..r0+15, columns c0..c0+15 of a row-major shared tile (ld columns).
__device__ inline void load_a(uint32_t (&a)[4], const bf16* s, int ld, int r0, int c0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  a[0] = ld32(s + (r0 + g) * ld + c0 + 2 * t);
  a[1] = ld32(s + (r0 + g + 8) * ld + c0 + 2 * t);
  a[2] = ld32(s + (r0 + g) * ld + c0 + 8 + 2 * t);
  a[3] = ld32(s + (r0 + g + 8) * ld + c0 + 8 + 2 * t);
}

// The B fragment (k = c0..c0+15, n = n0..n0+7) of B[k][n] = s[n][k]: a tile stored n-major.
__device__ inline void load_b(uint32_t& b0, uint32_t& b1, const bf16* s, int ld, int n0, int c0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  b0 = ld32(s + (n0 + g) * ld + c0 + 2 * t);
  b1 = ld32(s + (n0 + g) * ld + c0 + 8 + 2 * t);
}

// Accumulator tiles acc[2kk], acc[2kk + 1] (16 rows x 16 columns) as the A fragment of the next
// product: the register layouts line up, only rounding to bf16 is needed.
__device__ inline void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// Rows [r0, r0 + R) of one head of a view into shared memory as bf16: row-major [R][D + kPad]
// and/or transposed [D][R + kPad] (either may be null). Rows past the view's end are zeros.
template <int D, int R>
__device__ inline void stage_rows(bf16* rows, bf16* cols, const float* base, const AttnView& v,
                                  int64_t r0, int64_t bb, int64_t head) {
  constexpr int kPairs = D / 2;
  for (int e = threadIdx.x; e < R * kPairs; e += blockDim.x) {
    const int r = e / kPairs, c = 2 * (e % kPairs);
    float2 x = make_float2(0.0f, 0.0f);
    if (r0 + r < v.s) x = *reinterpret_cast<const float2*>(base + view_at(v, r0 + r, bb, head) + c);
    const __nv_bfloat162 h = __floats2bfloat162_rn(x.x, x.y);
    if (rows) *reinterpret_cast<__nv_bfloat162*>(rows + r * (D + kPad) + c) = h;
    if (cols) {
      cols[c * (R + kPad) + r] = h.x;
      cols[(c + 1) * (R + kPad) + r] = h.y;
    }
  }
}

// Whether every (query, key) of the tile is visible, so that the per-element test can be skipped.
__device__ inline bool tile_visible(const AttnArgs& a, int64_t i0, int rows, int64_t j0, int cols) {
  if (a.doc_start || a.key_valid) return false;
  if (i0 + rows > a.q.s || j0 + cols > a.k.s) return false;
  return !a.causal || a.kv_offset + j0 + cols - 1 <= a.q_offset + i0;
}

// Keys a block of query rows [i0, i0 + rows) can see at most: causal rows stop at their own
// position.
__device__ inline int64_t keys_end(const AttnArgs& a, int64_t i0, int rows) {
  if (!a.causal) return a.k.s;
  const int64_t last = min(a.q.s - 1, i0 + rows - 1) + a.q_offset - a.kv_offset + 1;
  return last < 0 ? 0 : min(last, a.k.s);
}

template <int D>
__global__ void __launch_bounds__(kThreadsFa)
    forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                   AttnArgs a) {
  constexpr int kLd = D + kPad, kTLd = kRows + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // [64][kLd]
  bf16* ks = qs + kRows * kLd;                    // [64][kLd]
  bf16* vt = ks + kRows * kLd;                    // [D][kTLd]
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int wr = 16 * warp;
  const int64_t sq = a.q.s;
  const int64_t bb = blockIdx.y / a.np, h = blockIdx.y % a.np, kvh = h / (a.np / a.ng);
  const int64_t i0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t row[2] = {i0 + wr + g, i0 + wr + g + 8};
  stage_rows<D, kRows>(qs, nullptr, q, a.q, i0, bb, h);
  __syncthreads();
  uint32_t qa[D / 16][4];
  #pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qa[kk], qs, kLd, wr, 16 * kk);
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;
  const int64_t kv_end = keys_end(a, i0, kRows);
  for (int64_t j0 = 0; j0 < kv_end; j0 += kRows) {
    __syncthreads();  // the previous tile's readers are done
    stage_rows<D, kRows>(ks, nullptr, k, a.k, j0, bb, kvh);
    stage_rows<D, kRows>(nullptr, vt, v, a.v, j0, bb, kvh);
    __syncthreads();
    float s[kRows / 8][4] = {};
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      #pragma unroll
      for (int nb = 0; nb < kRows / 8; ++nb) {
        uint32_t b0, b1;
        load_b(b0, b1, ks, kLd, 8 * nb, 16 * kk);
        mma(s[nb], qa[kk], b0, b1);
      }
    }
    const bool all = tile_visible(a, i0, kRows, j0, kRows);
    float mx[2] = {-INFINITY, -INFINITY};
    #pragma unroll
    for (int nb = 0; nb < kRows / 8; ++nb) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = j0 + 8 * nb + 2 * t + (e & 1);
        float x = s[nb][e] * scale2;
        if (!all && !visible(a, bb, row[r], j)) x = -INFINITY;
        s[nb][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float base[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {  // the 4 threads of a row group share its maximum
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      base[r] = mn == -INFINITY ? 0.0f : mn;  // nothing visible yet: every p is 0
      const float corr = exp2f(m[r] - base[r]);
      m[r] = mn;
      l[r] *= corr;
      #pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        o[db][2 * r] *= corr;
        o[db][2 * r + 1] *= corr;
      }
    }
    #pragma unroll
    for (int nb = 0; nb < kRows / 8; ++nb) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = exp2f(s[nb][e] - base[r]);
        l[r] += p;  // this thread's share of the row sum (dropout scales only the output)
        if (a.dropout > 0.0f && p != 0.0f) {
          p *= keep_scale<float>(a, bb, h, row[r], j0 + 8 * nb + 2 * t + (e & 1));
        }
        s[nb][e] = p;
      }
    }
    #pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      uint32_t pa[4];
      acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
      #pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        uint32_t b0, b1;
        load_b(b0, b1, vt, kTLd, 8 * db, 16 * kk);
        mma(o[db], pa, b0, b1);
      }
    }
  }
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (row[r] >= sq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* orow = out + ((row[r] * a.q.b + bb) * a.np + h) * D;
    #pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      *reinterpret_cast<float2*>(orow + 8 * db + 2 * t) =
          make_float2(o[db][2 * r] * inv, o[db][2 * r + 1] * inv);
    }
    if (t == 0) {
      lse[(bb * a.np + h) * sq + row[r]] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
    }
  }
}

// dk, dv of 64 keys of one key/value head: for each query head of its group and each tile of
// kQ queries, S^T = K Q^T and dP^T = V dO^T (16 keys x kQ queries per warp), P^T from lse,
// dS^T = P^T (keep dP^T - delta), then dV += (keep P^T) dO and dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreadsFa)
    dkv_kernel(float* dk, float* dv, const float* delta, const float* dout, const float* q,
               const float* k, const float* v, const float* lse, AttnArgs a, AttnView dov) {
  constexpr int kQ = kInner<D>, kLd = D + kPad, kTLd = kQ + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);  // [64][kLd]
  bf16* vs = ks + kRows * kLd;                    // [64][kLd]
  bf16* qs = vs + kRows * kLd;                    // [kQ][kLd]
  bf16* dos = qs + kQ * kLd;                      // [kQ][kLd]
  bf16* qt = dos + kQ * kLd;                      // [D][kTLd]
  bf16* dot = qt + D * kTLd;                      // [D][kTLd]
  float* lse_s = reinterpret_cast<float*>(dot + D * kTLd);  // [kQ], base 2
  float* delta_s = lse_s + kQ;                              // [kQ]
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const int wr = 16 * warp;
  const int64_t sq = a.q.s, skv = a.k.s, qpg = a.np / a.ng;
  const int64_t bb = blockIdx.y / a.ng, kvh = blockIdx.y % a.ng;
  const int64_t j0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t key[2] = {j0 + wr + g, j0 + wr + g + 8};
  stage_rows<D, kRows>(ks, nullptr, k, a.k, j0, bb, kvh);
  stage_rows<D, kRows>(vs, nullptr, v, a.v, j0, bb, kvh);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  // Causal: the queries before this block's first key see none of it.
  int64_t i_begin = 0;
  if (a.causal) {
    i_begin = min(max(j0 + a.kv_offset - a.q_offset, int64_t{0}), sq);
    i_begin -= i_begin % kQ;
  }
  const float scale2 = a.scale * kLog2e;
  for (int64_t h = kvh * qpg; h < (kvh + 1) * qpg; ++h) {
    for (int64_t i0 = i_begin; i0 < sq; i0 += kQ) {
      __syncthreads();
      stage_rows<D, kQ>(qs, qt, q, a.q, i0, bb, h);
      stage_rows<D, kQ>(dos, dot, dout, dov, i0, bb, h);
      for (int r = threadIdx.x; r < kQ; r += blockDim.x) {
        const int64_t i = i0 + r;
        lse_s[r] = i < sq ? lse[(bb * a.np + h) * sq + i] * kLog2e : -INFINITY;
        delta_s[r] = i < sq ? delta[(bb * a.np + h) * sq + i] : 0.0f;
      }
      __syncthreads();
      float st[kQ / 8][4] = {}, dpt[kQ / 8][4] = {};
      #pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, ks, kLd, wr, 16 * kk);
        load_a(va, vs, kLd, wr, 16 * kk);
        #pragma unroll
        for (int nb = 0; nb < kQ / 8; ++nb) {
          uint32_t b0, b1;
          load_b(b0, b1, qs, kLd, 8 * nb, 16 * kk);
          mma(st[nb], ka, b0, b1);
          load_b(b0, b1, dos, kLd, 8 * nb, 16 * kk);
          mma(dpt[nb], va, b0, b1);
        }
      }
      const bool all = tile_visible(a, i0, kQ, j0, kRows);
      #pragma unroll
      for (int nb = 0; nb < kQ / 8; ++nb) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, col = 8 * nb + 2 * t + (e & 1);
          const int64_t i = i0 + col;
          float p = 0.0f, ds = 0.0f;
          if (all || visible(a, bb, i, key[r])) {
            p = exp2f(st[nb][e] * scale2 - lse_s[col]);
            const float keep = keep_scale<float>(a, bb, h, i, key[r]);
            ds = p * (keep * dpt[nb][e] - delta_s[col]);
            p *= keep;
          }
          st[nb][e] = p;
          dpt[nb][e] = ds;
        }
      }
      #pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) {
        uint32_t pa[4], da[4];
        acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        acc_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
        #pragma unroll
        for (int db = 0; db < D / 8; ++db) {
          uint32_t b0, b1;
          load_b(b0, b1, dot, kTLd, 8 * db, 16 * kk);
          mma(dv_acc[db], pa, b0, b1);
          load_b(b0, b1, qt, kTLd, 8 * db, 16 * kk);
          mma(dk_acc[db], da, b0, b1);
        }
      }
    }
  }
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= skv) continue;
    float* dkp = dk + view_at(a.dk, key[r], bb, kvh);
    float* dvp = dv + view_at(a.dv, key[r], bb, kvh);
    #pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      *reinterpret_cast<float2*>(dkp + 8 * db + 2 * t) =
          make_float2(dk_acc[db][2 * r] * a.scale, dk_acc[db][2 * r + 1] * a.scale);
      *reinterpret_cast<float2*>(dvp + 8 * db + 2 * t) =
          make_float2(dv_acc[db][2 * r], dv_acc[db][2 * r + 1]);
    }
  }
}

// dq of 64 query rows of one head: for each tile of kK keys, S = Q K^T and dP = dO V^T, P from
// lse, dS = P (keep dP - delta), dQ += dS K.
template <int D>
__global__ void __launch_bounds__(kThreadsFa)
    dq_kernel(float* dq, const float* delta, const float* dout, const float* q, const float* k,
              const float* v, const float* lse, AttnArgs a, AttnView dov) {
  constexpr int kK = kInner<D>, kLd = D + kPad, kTLd = kK + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // [64][kLd]
  bf16* dos = qs + kRows * kLd;                   // [64][kLd]
  bf16* ks = dos + kRows * kLd;                   // [kK][kLd]
  bf16* vs = ks + kK * kLd;                       // [kK][kLd]
  bf16* kt = vs + kK * kLd;                       // [D][kTLd]
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const int wr = 16 * warp;
  const int64_t sq = a.q.s;
  const int64_t bb = blockIdx.y / a.np, h = blockIdx.y % a.np, kvh = h / (a.np / a.ng);
  const int64_t i0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t row[2] = {i0 + wr + g, i0 + wr + g + 8};
  stage_rows<D, kRows>(qs, nullptr, q, a.q, i0, bb, h);
  stage_rows<D, kRows>(dos, nullptr, dout, dov, i0, bb, h);
  float lse2[2], dlt[2];
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in = row[r] < sq;
    lse2[r] = in ? lse[(bb * a.np + h) * sq + row[r]] * kLog2e : -INFINITY;
    dlt[r] = in ? delta[(bb * a.np + h) * sq + row[r]] : 0.0f;
  }
  float dq_acc[D / 8][4] = {};
  const float scale2 = a.scale * kLog2e;
  const int64_t kv_end = keys_end(a, i0, kRows);
  for (int64_t j0 = 0; j0 < kv_end; j0 += kK) {
    __syncthreads();
    stage_rows<D, kK>(ks, kt, k, a.k, j0, bb, kvh);
    stage_rows<D, kK>(vs, nullptr, v, a.v, j0, bb, kvh);
    __syncthreads();
    float s[kK / 8][4] = {}, dp[kK / 8][4] = {};
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], oa[4];
      load_a(qa, qs, kLd, wr, 16 * kk);
      load_a(oa, dos, kLd, wr, 16 * kk);
      #pragma unroll
      for (int nb = 0; nb < kK / 8; ++nb) {
        uint32_t b0, b1;
        load_b(b0, b1, ks, kLd, 8 * nb, 16 * kk);
        mma(s[nb], qa, b0, b1);
        load_b(b0, b1, vs, kLd, 8 * nb, 16 * kk);
        mma(dp[nb], oa, b0, b1);
      }
    }
    const bool all = tile_visible(a, i0, kRows, j0, kK);
    #pragma unroll
    for (int nb = 0; nb < kK / 8; ++nb) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = j0 + 8 * nb + 2 * t + (e & 1);
        float ds = 0.0f;
        if (all || visible(a, bb, row[r], j)) {
          const float p = exp2f(s[nb][e] * scale2 - lse2[r]);
          ds = p * (keep_scale<float>(a, bb, h, row[r], j) * dp[nb][e] - dlt[r]);
        }
        s[nb][e] = ds;
      }
    }
    #pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      uint32_t da[4];
      acc_to_a(da, s[2 * kk], s[2 * kk + 1]);
      #pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        uint32_t b0, b1;
        load_b(b0, b1, kt, kTLd, 8 * db, 16 * kk);
        mma(dq_acc[db], da, b0, b1);
      }
    }
  }
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= sq) continue;
    float* d = dq + view_at(a.dq, row[r], bb, h);
    #pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      *reinterpret_cast<float2*>(d + 8 * db + 2 * t) =
          make_float2(dq_acc[db][2 * r] * a.scale, dq_acc[db][2 * r + 1] * a.scale);
    }
  }
}

template <int D>
constexpr size_t forward_smem() {
  return sizeof(bf16) * (2 * kRows * (D + kPad) + D * (kRows + kPad));
}
template <int D>
constexpr size_t dkv_smem() {
  constexpr int kQ = kInner<D>;
  return sizeof(bf16) * (2 * kRows * (D + kPad) + 2 * kQ * (D + kPad) + 2 * D * (kQ + kPad)) +
         sizeof(float) * 2 * kQ;
}
template <int D>
constexpr size_t dq_smem() {
  constexpr int kK = kInner<D>;
  return sizeof(bf16) * (2 * kRows * (D + kPad) + 2 * kK * (D + kPad) + D * (kK + kPad));
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    cuda_fail(what, "cannot reserve the shared memory of the tensor-core attention kernel");
  }
}

bool aligned(const AttnView& v, const float* base) {
  const bool even = (v.offset | v.stride_s | v.stride_b | v.stride_g | v.stride_p) % 2 == 0;
  return even && reinterpret_cast<uintptr_t>(base) % 8 == 0;
}

// dout as a view: [sq, b, np, hn] contiguous, one head per group.
AttnView dout_view(const AttnArgs& a) {
  const int64_t hn = a.q.hn;
  return AttnView{0, a.q.s, a.q.b, a.np, 1, hn, a.q.b * a.np * hn, a.np * hn, hn, 0};
}

template <int D>
void forward_d(float* out, float* lse, const float* q, const float* k, const float* v,
               const AttnArgs& a) {
  constexpr size_t bytes = forward_smem<D>();
  allow_smem(forward_kernel<D>, bytes, "flash_attention_forward");
  const dim3 grid(static_cast<unsigned>((a.q.s + kRows - 1) / kRows),
                  static_cast<unsigned>(a.q.b * a.np));
  forward_kernel<D><<<grid, kThreadsFa, bytes>>>(out, lse, q, k, v, a);
  check_launch("flash_attention_forward");
}

template <int D>
void backward_d(float* dq, float* dk, float* dv, const float* delta, const float* dout,
                const float* q, const float* k, const float* v, const float* lse,
                const AttnArgs& a) {
  const AttnView dov = dout_view(a);
  if (a.k.s > 0) {
    constexpr size_t bytes = dkv_smem<D>();
    allow_smem(dkv_kernel<D>, bytes, "flash_attention_backward (dk, dv)");
    const dim3 grid(static_cast<unsigned>((a.k.s + kRows - 1) / kRows),
                    static_cast<unsigned>(a.q.b * a.ng));
    dkv_kernel<D><<<grid, kThreadsFa, bytes>>>(dk, dv, delta, dout, q, k, v, lse, a, dov);
    check_launch("flash_attention_backward (dk, dv)");
  }
  if (a.q.s > 0) {
    constexpr size_t bytes = dq_smem<D>();
    allow_smem(dq_kernel<D>, bytes, "flash_attention_backward (dq)");
    const dim3 grid(static_cast<unsigned>((a.q.s + kRows - 1) / kRows),
                    static_cast<unsigned>(a.q.b * a.np));
    dq_kernel<D><<<grid, kThreadsFa, bytes>>>(dq, delta, dout, q, k, v, lse, a, dov);
    check_launch("flash_attention_backward (dq)");
  }
}

}  // namespace

bool flash_attention_applies(const AttnArgs& a, bool has_bias, const float* q, const float* k,
                             const float* v, const float* dq, const float* dk, const float* dv) {
  if (!a.matrix_units || has_bias || (a.q.hn != 64 && a.q.hn != 128)) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8) {
    return false;  // bf16 mma.sync needs sm_80
  }
  return aligned(a.q, q) && aligned(a.k, k) && aligned(a.v, v) && (!dq || aligned(a.dq, dq)) &&
         (!dk || aligned(a.dk, dk)) && (!dv || aligned(a.dv, dv));
}

void flash_attention_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttnArgs& a) {
  if (a.q.s == 0 || a.q.b == 0 || a.np == 0) return;
  if (a.q.hn == 64) {
    forward_d<64>(out, lse, q, k, v, a);
  } else {
    forward_d<128>(out, lse, q, k, v, a);
  }
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* delta,
                              const float* dout, const float* q, const float* k, const float* v,
                              const float* lse, const AttnArgs& a) {
  if (a.q.b == 0 || a.np == 0) return;
  if (a.q.hn == 64) {
    backward_d<64>(dq, dk, dv, delta, dout, q, k, v, lse, a);
  } else {
    backward_d<128>(dq, dk, dv, delta, dout, q, k, v, lse, a);
  }
}

}  // namespace megatron::cuda
