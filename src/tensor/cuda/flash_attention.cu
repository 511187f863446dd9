// Flash attention on the tensor cores (FlashAttention-2's schedule with mma.sync.m16n8k16 bf16
// instructions, sm_80 and later): the same masks, GQA and dropout counters as attention.cu, for
// head dimensions 64 and 128 and no score bias, in bf16 runs (AttentionSpec::precision).
//
// A block is W warps; each warp owns 16 rows of the block's 16 W (query rows in forward and dq,
// key rows in dk/dv) and the block walks the other side in tiles. Operands are read from f32 global
// memory (16 bytes per load), rounded to bf16 and staged row-major in shared memory, each row
// padded by 8 bf16 so that the 8 rows one ldmatrix phase reads fall in different banks; ldmatrix
// (.trans where the product reads along the rows) turns the tiles into mma fragments. Scores,
// probabilities and gradients of a tile live in the mma accumulators (16 x 8 f32 per warp and
// instruction: thread t holds rows t/4 and t/4 + 8, columns 2 (t % 4) and 2 (t % 4) + 1), and
// those accumulators become the next product's A fragments without leaving registers. The softmax
// runs in base 2 (scores times scale * log2 e; lse stored in base e).
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

// Block shapes: warps per block (16 rows each, so 16 W rows per block) and the blocks per SM
// their registers are capped for (__launch_bounds__), the best of the variants measured on an
// H200 (s 1024, 12 and 16 heads of 64; s 4096, 32 heads of 128): forward 8 warps, 2 blocks per SM
// at hn 64 (51 TFLOP/s against 35 at one block) and one at hn 128 (a cap of 128 registers
// spills there); backward 4 warps, 3 blocks per SM at hn 64, 8 warps and one block at hn 128.
template <int D>
struct ForwardShape {
  static constexpr int kWarps = 8, kMinBlocks = D == 64 ? 2 : 1;
};
template <int D>
struct BackwardShape {
  static constexpr int kWarps = D == 64 ? 4 : 8, kMinBlocks = D == 64 ? 3 : 1;
};
constexpr int kPad = 8;  // bf16 of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The inner tiles, sized so that a warp's accumulators stay in registers: keys per step of dq
// (16 x hn of dq, and 16 x kKeysDq of scores and of dP), queries per step of dk/dv (16 x hn of
// dk and of dv, and 16 x kQueriesDkv of P^T and of dP^T).
template <int D>
constexpr int kKeysDq = D == 128 ? 32 : 64;
template <int D>
constexpr int kQueriesDkv = D == 128 ? 16 : 32;

__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix
// l / 8; register i holds row (lane / 4), columns 2 (lane % 4) + {0, 1} of matrix i (transposed:
// rows 2 (lane % 4) + {0, 1}, column lane / 4).
__device__ inline void ldsm(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}
__device__ inline void ldsm_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}

// Two floats rounded to bf16 (nearest even), the first in the low half: one A-fragment register.
__device__ inline uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a b for a 16 x 16 bf16 A (row-major fragment), a 16 x 8 bf16 B (column-major), f32 c.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of rows r0..r0+15, columns c0..c0+15 of a row-major tile (ld bf16 per row).
__device__ inline void load_a(uint32_t (&a)[4], const bf16* s, int ld, int r0, int c0) {
  const int l = threadIdx.x & 31, m = l >> 3;
  ldsm(a, s + (r0 + (l & 7) + (m & 1) * 8) * ld + c0 + (m >> 1) * 8);
}

// B fragments (k = c0..c0+15) for n-blocks n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]) of
// B[k][n] = s[n][k]: a tile stored n-major (keys for Q K^T, queries for K Q^T).
__device__ inline void load_b_nmajor(uint32_t (&b)[4], const bf16* s, int ld, int n0, int c0) {
  const int l = threadIdx.x & 31, m = l >> 3;
  ldsm(b, s + (n0 + (l & 7) + (m >> 1) * 8) * ld + c0 + (m & 1) * 8);
}

// The same for B[k][n] = s[k][n], a tile stored k-major (V for P V, Q for dS^T Q, ...).
__device__ inline void load_b_kmajor(uint32_t (&b)[4], const bf16* s, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, m = l >> 3;
  ldsm_t(b, s + (k0 + (l & 7) + (m & 1) * 8) * ld + n0 + (m >> 1) * 8);
}

// The two products of a backward step for a warp's 16 rows (wr..wr+15) and N columns, over the
// D channels: x += A1 B1^T and y += A2 B2^T, A1 and A2 row-major tiles of the warp's rows, B1 and
// B2 n-major tiles of the columns ([N][D + kPad] each). dk/dv: S^T = K Q^T and dP^T = V dO^T;
// dq: S = Q K^T and dP = dO V^T.
template <int D, int N>
__device__ inline void two_products(float (&x)[N / 8][4], float (&y)[N / 8][4], const bf16* a1,
                                    const bf16* a2, const bf16* b1, const bf16* b2, int wr) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t f1[4], f2[4];
    load_a(f1, a1, kLd, wr, 16 * kk);
    load_a(f2, a2, kLd, wr, 16 * kk);
#pragma unroll
    for (int nb = 0; nb < N / 8; nb += 2) {
      uint32_t b[4];
      load_b_nmajor(b, b1, kLd, 8 * nb, 16 * kk);
      mma(x[nb], f1, b[0], b[1]);
      mma(x[nb + 1], f1, b[2], b[3]);
      load_b_nmajor(b, b2, kLd, 8 * nb, 16 * kk);
      mma(y[nb], f2, b[0], b[1]);
      mma(y[nb + 1], f2, b[2], b[3]);
    }
  }
}

// Accumulator tiles acc[2kk], acc[2kk + 1] (16 rows x 16 columns) as the A fragment of the next
// product: the register layouts line up, only rounding to bf16 is needed.
__device__ inline void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// acc += X B for a warp: X its 16 x N accumulator tile (rounded to bf16 as the A operand), B a
// k-major tile [N][D + kPad] (row n: the D channels of column n of X). Forward: O += P V;
// dk/dv: dV += P^T dO, dK += dS^T Q; dq: dQ += dS K.
template <int D, int N>
__device__ inline void product_into(float (&acc)[D / 8][4], const float (&x)[N / 8][4],
                                    const bf16* b) {
  constexpr int kLd = D + kPad;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t xa[4];
    acc_to_a(xa, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
    for (int db = 0; db < D / 8; db += 2) {
      uint32_t f[4];
      load_b_kmajor(f, b, kLd, 16 * kk, 8 * db);
      mma(acc[db], xa, f[0], f[1]);
      mma(acc[db + 1], xa, f[2], f[3]);
    }
  }
}

// Offset of row 0, channel 0 of one head of a view (rows follow at stride_s).
__device__ inline int64_t head_base(const AttnView& v, int64_t bb, int64_t head) {
  return view_at(v, 0, bb, head);
}

// Rows [r0, r0 + R) of one head (at `base`, rows stride_s apart, `s` of them) into a row-major
// shared tile [R][D + kPad] as bf16; rows past the end are zeros.
template <int D, int R>
__device__ inline void stage_rows(bf16* tile, const float* base, int64_t stride_s, int64_t s,
                                  int64_t r0) {
  constexpr int kQuads = D / 4;
  for (int e = threadIdx.x; e < R * kQuads; e += blockDim.x) {
    const int r = e / kQuads, c = 4 * (e % kQuads);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r0 + r < s) x = *reinterpret_cast<const float4*>(base + (r0 + r) * stride_s + c);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(tile + r * (D + kPad) + c) = packed;
  }
}

// The tiles a kernel walks are double-buffered: while the warps compute on the bf16 tiles of one
// step, cp.async copies the next step's f32 rows into a staging area (no registers held, the copy
// engine's loads in flight), and a short pass then rounds them into the bf16 tiles.
__device__ inline void cp_async16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ inline void cp_async4(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)),
               "l"(global), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ inline void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Starts copying rows [r0, r0 + R) of one head into an f32 staging area [R][D] (rows past the end
// are zero-filled).
template <int D, int R>
__device__ inline void fetch_rows(float* stage, const float* base, int64_t stride_s, int64_t s,
                                  int64_t r0) {
  constexpr int kQuads = D / 4;
  for (int e = threadIdx.x; e < R * kQuads; e += blockDim.x) {
    const int r = e / kQuads, c = 4 * (e % kQuads);
    const bool in = r0 + r < s;
    cp_async16(stage + r * D + c, in ? base + (r0 + r) * stride_s + c : base, in);
  }
}

// Staged f32 rows rounded into a bf16 tile [R][D + kPad].
template <int D, int R>
__device__ inline void round_rows(bf16* tile, const float* stage) {
  constexpr int kQuads = D / 4;
  for (int e = threadIdx.x; e < R * kQuads; e += blockDim.x) {
    const int r = e / kQuads, c = 4 * (e % kQuads);
    const float4 x = *reinterpret_cast<const float4*>(stage + r * D + c);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(tile + r * (D + kPad) + c) = packed;
  }
}

// A key/value tile (rows j0..) of forward and dq: started into staging, and rounded from it.
template <int D, int K>
__device__ inline void fetch_kv(float* kf, float* vf, const float* kbase, const float* vbase,
                                const AttnArgs& a, int64_t j0) {
  fetch_rows<D, K>(kf, kbase, a.k.stride_s, a.k.s, j0);
  fetch_rows<D, K>(vf, vbase, a.v.stride_s, a.v.s, j0);
}
template <int D, int K>
__device__ inline void round_kv(bf16* ks, bf16* vs, const float* kf, const float* vf) {
  round_rows<D, K>(ks, kf);
  round_rows<D, K>(vs, vf);
}

// The end of a forward or dq step: this thread's copies of the next tile waited for, every warp
// done with the current tile, the next one rounded in and visible to all.
template <int D, int K>
__device__ inline void advance_kv(bool more, bf16* ks, bf16* vs, const float* kf, const float* vf) {
  cp_async_wait_all();
  __syncthreads();
  if (more) round_kv<D, K>(ks, vs, kf, vf);
  __syncthreads();
}

// Whether every (query, key) of the tile is visible, so that the per-element test can be skipped.
__device__ inline bool tile_visible(const AttnArgs& a, int64_t i0, int rows, int64_t j0, int cols) {
  if (a.doc_start || a.key_valid) return false;
  if (i0 + rows > a.q.s || j0 + cols > a.k.s) return false;
  // The window's first visible key of the tile's first row is its last hidden one for later rows.
  if (a.window >= 0 && a.kv_offset + j0 < a.q_offset + i0 + rows - 1 - a.window) return false;
  return !a.causal || a.kv_offset + j0 + cols - 1 <= a.q_offset + i0;
}

// Keys a block of query rows [i0, i0 + rows) can see at most: causal rows stop at their own
// position.
__device__ inline int64_t keys_end(const AttnArgs& a, int64_t i0, int rows) {
  if (!a.causal) return a.k.s;
  const int64_t last = min(a.q.s - 1, i0 + rows - 1) + a.q_offset - a.kv_offset + 1;
  return last < 0 ? 0 : min(last, a.k.s);
}

// Where a forward or dq block works: (batch, head) from blockIdx.y, query rows from blockIdx.x,
// the warp's 16 of them and this thread's two (t/4 and t/4 + 8 of its accumulator tiles), the
// key/value head it reads and how far its keys go.
struct QueryBlock {
  int t, wr;
  int64_t bb, h, i0, row[2], kv_end;
  const float *kbase, *vbase;
  __device__ QueryBlock(const AttnArgs& a, int rows, const float* k, const float* v) {
    const int g = (threadIdx.x & 31) >> 2;
    t = threadIdx.x & 3;
    wr = 16 * (threadIdx.x >> 5);
    bb = blockIdx.y / a.np;
    h = blockIdx.y % a.np;
    const int64_t kvh = h / (a.np / a.ng);
    i0 = blockIdx.x * static_cast<int64_t>(rows);
    row[0] = i0 + wr + g;
    row[1] = i0 + wr + g + 8;
    kv_end = keys_end(a, i0, rows);
    kbase = k + head_base(a.k, bb, kvh);
    vbase = v + head_base(a.v, bb, kvh);
  }
};

template <int D, int W, int B>
__global__ void __launch_bounds__(32 * W, B)
    forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                   AttnArgs a) {
  constexpr int kRows = 16 * W, kK = 64, kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);         // [kRows][kLd]
  bf16* ks = qs + kRows * kLd;                          // [kK][kLd]
  bf16* vs = ks + kK * kLd;                             // [kK][kLd]
  float* kf = reinterpret_cast<float*>(vs + kK * kLd);  // [kK][D] staging of the next tile
  float* vf = kf + kK * D;                              // [kK][D]
  const QueryBlock qb(a, kRows, k, v);
  const int t = qb.t, wr = qb.wr;
  const int64_t sq = a.q.s, bb = qb.bb, h = qb.h, i0 = qb.i0, kv_end = qb.kv_end;
  const int64_t(&row)[2] = qb.row;
  if (kv_end > 0) fetch_kv<D, kK>(kf, vf, qb.kbase, qb.vbase, a, 0);
  cp_async_commit();
  stage_rows<D, kRows>(qs, q + head_base(a.q, bb, h), a.q.stride_s, sq, i0);
  cp_async_wait_all();
  __syncthreads();
  round_kv<D, kK>(ks, vs, kf, vf);
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qa[kk], qs, kLd, wr, 16 * kk);
  __syncthreads();
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;
  for (int64_t j0 = 0; j0 < kv_end; j0 += kK) {
    const bool more = j0 + kK < kv_end;
    if (more) {
      fetch_kv<D, kK>(kf, vf, qb.kbase, qb.vbase, a, j0 + kK);
    }
    cp_async_commit();
    float s[kK / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < kK / 8; nb += 2) {
        uint32_t b[4];
        load_b_nmajor(b, ks, kLd, 8 * nb, 16 * kk);
        mma(s[nb], qa[kk], b[0], b[1]);
        mma(s[nb + 1], qa[kk], b[2], b[3]);
      }
    }
    const bool all = tile_visible(a, i0, kRows, j0, kK);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kK / 8; ++nb) {
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
    for (int nb = 0; nb < kK / 8; ++nb) {
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
    product_into<D, kK>(o, s, vs);
    advance_kv<D, kK>(more, ks, vs, kf, vf);
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
      // m is in log2 units (the scores were scaled by log2 e).
      if (l[r] > 0.0f) raise_max_logit(a, h, m[r] * kLn2);
    }
  }
}

// dk, dv of kRows keys of one key/value head: for each query head of its group and each tile of
// kQ queries, S^T = K Q^T and dP^T = V dO^T (16 keys x kQ queries per warp), P^T from lse,
// dS^T = P^T (keep dP^T - delta), then dV += (keep P^T) dO and dK += dS^T Q.
template <int D, int W, int B>
__global__ void __launch_bounds__(32 * W, B)
    dkv_kernel(float* dk, float* dv, const float* delta, const float* dout, const float* q,
               const float* k, const float* v, const float* lse, AttnArgs a, AttnView dov) {
  constexpr int kRows = 16 * W, kQ = kQueriesDkv<D>, kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);             // [kRows][kLd]
  bf16* vs = ks + kRows * kLd;                              // [kRows][kLd]
  bf16* qs = vs + kRows * kLd;                              // [kQ][kLd]
  bf16* dos = qs + kQ * kLd;                                // [kQ][kLd]
  float* lse_s = reinterpret_cast<float*>(dos + kQ * kLd);  // [kQ], base 2
  float* delta_s = lse_s + kQ;                              // [kQ]
  float* qf = delta_s + kQ;                                 // staging: [kQ][D] of q,
  float* dof = qf + kQ * D;                                 // [kQ][D] of dout,
  float* lsef = dof + kQ * D;                               // [kQ] of lse,
  float* deltaf = lsef + kQ;                                // [kQ] of delta
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
  const int wr = 16 * warp;
  const int64_t sq = a.q.s, skv = a.k.s, qpg = a.np / a.ng;
  const int64_t bb = blockIdx.y / a.ng, kvh = blockIdx.y % a.ng;
  const int64_t j0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t key[2] = {j0 + wr + g, j0 + wr + g + 8};
  stage_rows<D, kRows>(ks, k + head_base(a.k, bb, kvh), a.k.stride_s, skv, j0);
  stage_rows<D, kRows>(vs, v + head_base(a.v, bb, kvh), a.v.stride_s, skv, j0);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  // Causal: the queries before this block's first key see none of it.
  int64_t i_begin = 0;
  if (a.causal) {
    i_begin = min(max(j0 + a.kv_offset - a.q_offset, int64_t{0}), sq);
    i_begin -= i_begin % kQ;
  }
  const float scale2 = a.scale * kLog2e;
  // The steps: every query head h of the group, tiles i0 = i_begin, i_begin + kQ, ... < sq.
  const int64_t h_end = (kvh + 1) * qpg;
  auto fetch = [&](int64_t h, int64_t i0) {
    fetch_rows<D, kQ>(qf, q + head_base(a.q, bb, h), a.q.stride_s, sq, i0);
    fetch_rows<D, kQ>(dof, dout + head_base(dov, bb, h), dov.stride_s, sq, i0);
    for (int r = threadIdx.x; r < kQ; r += blockDim.x) {
      const bool in = i0 + r < sq;
      const int64_t at = (bb * a.np + h) * sq + (in ? i0 + r : 0);
      cp_async4(lsef + r, lse + at, in);
      cp_async4(deltaf + r, delta + at, in);
    }
  };
  auto round_step = [&](int64_t i0) {
    round_rows<D, kQ>(qs, qf);
    round_rows<D, kQ>(dos, dof);
    for (int r = threadIdx.x; r < kQ; r += blockDim.x) {
      lse_s[r] = i0 + r < sq ? lsef[r] * kLog2e : -INFINITY;
      delta_s[r] = deltaf[r];
    }
  };
  int64_t h = kvh * qpg, i0 = i_begin;
  if (i0 < sq) fetch(h, i0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  if (i0 < sq) round_step(i0);
  __syncthreads();
  while (i0 < sq && h < h_end) {
    int64_t next_h = h, next_i0 = i0 + kQ;
    if (next_i0 >= sq) {
      ++next_h;
      next_i0 = i_begin;
    }
    const bool more = next_h < h_end;
    if (more) fetch(next_h, next_i0);
    cp_async_commit();
    {
      float st[kQ / 8][4] = {}, dpt[kQ / 8][4] = {};
      two_products<D, kQ>(st, dpt, ks, vs, qs, dos, wr);
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
      product_into<D, kQ>(dv_acc, st, dos);
      product_into<D, kQ>(dk_acc, dpt, qs);
    }
    cp_async_wait_all();
    __syncthreads();
    if (more) round_step(next_i0);
    __syncthreads();
    h = next_h;
    i0 = next_i0;
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

// dq of kRows query rows of one head: for each tile of kK keys, S = Q K^T and dP = dO V^T, P from
// lse, dS = P (keep dP - delta), dQ += dS K.
template <int D, int W, int B>
__global__ void __launch_bounds__(32 * W, B)
    dq_kernel(float* dq, const float* delta, const float* dout, const float* q, const float* k,
              const float* v, const float* lse, AttnArgs a, AttnView dov) {
  constexpr int kRows = 16 * W, kK = kKeysDq<D>, kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);         // [kRows][kLd]
  bf16* dos = qs + kRows * kLd;                         // [kRows][kLd]
  bf16* ks = dos + kRows * kLd;                         // [kK][kLd]
  bf16* vs = ks + kK * kLd;                             // [kK][kLd]
  float* kf = reinterpret_cast<float*>(vs + kK * kLd);  // [kK][D] staging of the next tile
  float* vf = kf + kK * D;                              // [kK][D]
  const QueryBlock qb(a, kRows, k, v);
  const int t = qb.t, wr = qb.wr;
  const int64_t sq = a.q.s, bb = qb.bb, h = qb.h, i0 = qb.i0, kv_end = qb.kv_end;
  const int64_t(&row)[2] = qb.row;
  if (kv_end > 0) fetch_kv<D, kK>(kf, vf, qb.kbase, qb.vbase, a, 0);
  cp_async_commit();
  stage_rows<D, kRows>(qs, q + head_base(a.q, bb, h), a.q.stride_s, sq, i0);
  stage_rows<D, kRows>(dos, dout + head_base(dov, bb, h), dov.stride_s, sq, i0);
  cp_async_wait_all();
  __syncthreads();
  round_kv<D, kK>(ks, vs, kf, vf);
  __syncthreads();
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in = row[r] < sq;
    lse2[r] = in ? lse[(bb * a.np + h) * sq + row[r]] * kLog2e : -INFINITY;
    dlt[r] = in ? delta[(bb * a.np + h) * sq + row[r]] : 0.0f;
  }
  float dq_acc[D / 8][4] = {};
  const float scale2 = a.scale * kLog2e;
  for (int64_t j0 = 0; j0 < kv_end; j0 += kK) {
    const bool more = j0 + kK < kv_end;
    if (more) {
      fetch_kv<D, kK>(kf, vf, qb.kbase, qb.vbase, a, j0 + kK);
    }
    cp_async_commit();
    float s[kK / 8][4] = {}, dp[kK / 8][4] = {};
    two_products<D, kK>(s, dp, qs, dos, ks, vs, wr);
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
    product_into<D, kK>(dq_acc, s, ks);
    advance_kv<D, kK>(more, ks, vs, kf, vf);
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

// Shared memory of a block of W warps: the bf16 tiles, then the f32 staging of the next step's.
template <int D, int W>
constexpr size_t forward_smem() {
  return sizeof(bf16) * (16 * W + 2 * 64) * (D + kPad) + sizeof(float) * 2 * 64 * D;
}
template <int D, int W>
constexpr size_t dkv_smem() {
  constexpr int kQ = kQueriesDkv<D>;
  return sizeof(bf16) * (2 * 16 * W + 2 * kQ) * (D + kPad) +
         sizeof(float) * (2 * kQ + 2 * kQ * D + 2 * kQ);
}
template <int D, int W>
constexpr size_t dq_smem() {
  return sizeof(bf16) * (2 * 16 * W + 2 * kKeysDq<D>)*(D + kPad) +
         sizeof(float) * 2 * kKeysDq<D> * D;
}

// The kernel's dynamic shared memory, with the SM's memory split towards shared memory so that
// the blocks its registers allow also fit.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
    cuda_fail(what, "cannot reserve the shared memory of the tensor-core attention kernel");
  }
}

// 16-byte loads of q, k, v and dout, 8-byte stores of out and the gradients.
bool aligned(const AttnView& v, const float* base, int64_t elements) {
  const bool whole = (v.offset | v.stride_s | v.stride_b | v.stride_g | v.stride_p) % elements == 0;
  return whole && reinterpret_cast<uintptr_t>(base) % (4 * elements) == 0;
}

// dout as a view: [sq, b, np, hn] contiguous, one head per group.
AttnView dout_view(const AttnArgs& a) {
  const int64_t hn = a.q.hn;
  return AttnView{0, a.q.s, a.q.b, a.np, 1, hn, a.q.b * a.np * hn, a.np * hn, hn, 0};
}

template <int D>
void forward_d(float* out, float* lse, const float* q, const float* k, const float* v,
               const AttnArgs& a) {
  constexpr int W = ForwardShape<D>::kWarps, B = ForwardShape<D>::kMinBlocks;
  constexpr size_t bytes = forward_smem<D, W>();
  allow_smem(forward_kernel<D, W, B>, bytes, "flash_attention_forward");
  const dim3 grid(static_cast<unsigned>((a.q.s + 16 * W - 1) / (16 * W)),
                  static_cast<unsigned>(a.q.b * a.np));
  forward_kernel<D, W, B><<<grid, 32 * W, bytes>>>(out, lse, q, k, v, a);
  check_launch("flash_attention_forward");
}

template <int D>
void backward_d(float* dq, float* dk, float* dv, const float* delta, const float* dout,
                const float* q, const float* k, const float* v, const float* lse,
                const AttnArgs& a) {
  constexpr int W = BackwardShape<D>::kWarps, B = BackwardShape<D>::kMinBlocks;
  const AttnView dov = dout_view(a);
  if (a.k.s > 0) {
    constexpr size_t bytes = dkv_smem<D, W>();
    allow_smem(dkv_kernel<D, W, B>, bytes, "flash_attention_backward (dk, dv)");
    const dim3 grid(static_cast<unsigned>((a.k.s + 16 * W - 1) / (16 * W)),
                    static_cast<unsigned>(a.q.b * a.ng));
    dkv_kernel<D, W, B><<<grid, 32 * W, bytes>>>(dk, dv, delta, dout, q, k, v, lse, a, dov);
    check_launch("flash_attention_backward (dk, dv)");
  }
  if (a.q.s > 0) {
    constexpr size_t bytes = dq_smem<D, W>();
    allow_smem(dq_kernel<D, W, B>, bytes, "flash_attention_backward (dq)");
    const dim3 grid(static_cast<unsigned>((a.q.s + 16 * W - 1) / (16 * W)),
                    static_cast<unsigned>(a.q.b * a.np));
    dq_kernel<D, W, B><<<grid, 32 * W, bytes>>>(dq, delta, dout, q, k, v, lse, a, dov);
    check_launch("flash_attention_backward (dq)");
  }
}

}  // namespace

bool flash_attention_applies(const AttnArgs& a, bool has_bias, const float* q, const float* k,
                             const float* v, const float* dq, const float* dk, const float* dv,
                             const float* dout) {
  if (!a.matrix_units || has_bias || (a.q.hn != 64 && a.q.hn != 128)) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8) {
    return false;  // bf16 mma.sync needs sm_80
  }
  return aligned(a.q, q, 4) && aligned(a.k, k, 4) && aligned(a.v, v, 4) &&
         (!dq || aligned(a.dq, dq, 2)) && (!dk || aligned(a.dk, dk, 2)) &&
         (!dv || aligned(a.dv, dv, 2)) && reinterpret_cast<uintptr_t>(dout) % 16 == 0;
}

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttnArgs& a) {
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
