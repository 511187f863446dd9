// Tiled scaled-dot-product attention with an online softmax (FlashAttention-2 style) on CPU.
//
// Forward walks 64-key tiles for a 64-row block of queries, keeping a running max and sum per row,
// so no sq x skv score matrix ever exists; it keeps only out and the per-row log-sum-exp. Backward
// recomputes probabilities from lse: P_ij = exp(scale q_i.k_j + bias_ij - lse_i), and with
// D_i = dO_i . O_i (equal to sum_j P_ij dP_ij, dropout included):
//   dV_j += Pd_ij dO_i,  dP_ij = mask_ij/(1-p) dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
//   dQ_i += scale dS_ij k_j,  dK_j += scale dS_ij q_i,  dbias_ij = dS_ij.
// Every product of tiles (S = Q K^T, O += P V, dP = dO V^T, dV += Pd^T dO, dK += dS^T Q,
// dQ += dS K) is a register-blocked tile GEMM (tile_gemm.h) on tiles copied out of the q, k, v
// views (packed QKV or separate tensors) into contiguous buffers, K and V transposed where the
// product needs them so.
//
// Parallelism: forward over (batch, head, query tile), whole heads per task where there are
// enough heads; backward over (batch, head), one task
// owning its head's dQ and its dK/dV contributions; with grouped queries those are then summed
// over the heads of each group in a fixed order, and a bias shared over the batch has its
// gradient summed over the batch in order. No atomics, no per-thread copies: results do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/philox.h"
#include "core/threads.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/tile_gemm.h"
#include "tensor/cpu/tile_gemm_bf16.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/ops.h"

namespace megatron::cpu {

namespace {

constexpr int64_t kTile = 64;  // query rows and key columns per tile
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// bf16 runs multiply bf16 tiles where the CPU has AVX-512 BF16 (tile_gemm_bf16.h): q, k, v,
// dout, the probabilities and dS rounded to bf16 as they are packed, products accumulated in
// f32, as Megatron's attention on bf16 activations. Everything else (the softmax, lse, D, the
// accumulators, dropout, the bias) stays f32.
template <typename T>
constexpr bool kBf16Capable = std::is_same_v<T, float>&& kBf16Tiles;
template <typename T>
bool bf16_tiles(const AttentionSpec& spec, int64_t hn) {
  return kBf16Capable<T> && spec.precision == DType::kBF16 && hn % 16 == 0;
}

// Row pointers into one view.
template <typename T>
struct Rows {
  T* base;
  AttentionView v;
  T* at(int64_t t, int64_t bb, int64_t head) const {
    return base + t * v.stride_s + bb * v.stride_b + (head / v.per_group) * v.stride_g +
           (head % v.per_group) * v.stride_p;
  }
};
template <typename T>
Rows<T> rows(const AttentionView& v) {
  return Rows<T>{v.tensor.data<T>() + v.offset, v};
}

// The q, k, v, out and gradient rows a kernel copies in or out lie a row of the [s, b, heads, hn]
// layout apart (b x heads x hn elements: 36 KB in config b's packed QKV), a few cache lines each,
// which the hardware prefetchers do not follow: the row loops ask for the row kAhead rows on.
constexpr int64_t kAhead = 4;
template <typename T>
inline void prefetch_row(const T* row, int64_t hn, bool for_write = false) {
  for (int64_t c = 0; c < hn; c += 64 / static_cast<int64_t>(sizeof(T))) {
    if (for_write) {
      __builtin_prefetch(row + c, 1);
    } else {
      __builtin_prefetch(row + c, 0);
    }
  }
}

// Sizes of one call, checked against every view and tensor.
struct Dims {
  int64_t sq, skv, b, np, ng, qpg, hn;
  int64_t o_off(int64_t t, int64_t bb, int64_t h) const { return ((t * b + bb) * np + h) * hn; }
  int64_t lse_off(int64_t t, int64_t bb, int64_t h) const { return (bb * np + h) * sq + t; }
};

void check_view(const AttentionView& v, const char* what) {
  MEGATRON_CHECK(v.tensor.defined(), "attention: ", what, " has no tensor");
  const int64_t last = v.offset + (v.s - 1) * v.stride_s + (v.b - 1) * v.stride_b +
                       (v.groups - 1) * v.stride_g + (v.per_group - 1) * v.stride_p + v.hn;
  MEGATRON_CHECK(v.s > 0 && v.b > 0 && v.hn > 0 && v.offset >= 0 && last <= v.tensor.numel(),
                 "attention: ", what, " view [", v.s, ", ", v.b, ", ", v.groups, ", ", v.per_group,
                 ", ", v.hn, "] reaches past its tensor ", v.tensor.str());
}

Dims make_dims(const AttentionView& q, const AttentionView& k, const AttentionView& v,
               const AttentionSpec& spec) {
  check_view(q, "q");
  check_view(k, "k");
  check_view(v, "v");
  MEGATRON_CHECK(
      k.per_group == 1 && v.per_group == 1 && k.groups == q.groups && v.groups == q.groups,
      "attention: k and v need one head per query group (", q.groups, " groups); got k ", k.groups,
      "x", k.per_group, ", v ", v.groups, "x", v.per_group);
  MEGATRON_CHECK(k.s == v.s && k.b == q.b && v.b == q.b && k.hn == q.hn && v.hn == q.hn,
                 "attention: q [", q.s, ", ", q.b, ", hn ", q.hn, "], k [", k.s, ", ", k.b, ", hn ",
                 k.hn, "], v [", v.s, ", ", v.b, ", hn ", v.hn,
                 "] must agree in batch and head size, k and v in length");
  MEGATRON_CHECK(q.tensor.dtype() == k.tensor.dtype() && q.tensor.dtype() == v.tensor.dtype(),
                 "attention: q, k, v dtypes differ");
  Dims d{q.s, k.s, q.b, q.heads(), q.groups, q.per_group, q.hn};
  if (spec.doc_start.defined()) {
    check_shape(spec.doc_start, {d.b, d.sq}, "attention doc_start");
    MEGATRON_CHECK(spec.doc_start.dtype() == DType::kI32, "attention: doc_start must be i32");
  }
  if (spec.key_valid.defined()) {
    check_shape(spec.key_valid, {d.b, d.skv}, "attention key_valid");
    MEGATRON_CHECK(spec.key_valid.dtype() == DType::kI32, "attention: key_valid must be i32");
  }
  if (spec.bias.defined()) {
    const int64_t bb = spec.bias.ndim() == 4 ? spec.bias.dim(0) : 0;
    MEGATRON_CHECK(bb == 1 || bb == d.b, "attention: bias must be [1 or b, np, sq, skv]");
    check_shape(spec.bias, {bb, d.np, d.sq, d.skv}, "attention bias");
    MEGATRON_CHECK(spec.bias.dtype() == q.tensor.dtype(), "attention: bias dtype must be q's");
  }
  if (spec.max_logit.defined()) {
    check_shape(spec.max_logit, {d.np}, "attention max_logit");
    MEGATRON_CHECK(spec.max_logit.dtype() == DType::kF32, "attention: max_logit must be f32");
  }
  return d;
}

// What a call sees of the mask, the bias and the dropout grid.
template <typename T>
struct Masking {
  const AttentionSpec& spec;
  const Dims& d;
  const int32_t* doc = nullptr;    // [b, sq]
  const int32_t* valid = nullptr;  // [b, skv]
  const T* bias = nullptr;         // [B, np, sq, skv]
  bool bias_shared = false;
  int64_t heads = 0, qpos = 0, kvpos = 0;

  Masking(const AttentionSpec& s, const Dims& dims) : spec(s), d(dims) {
    if (s.doc_start.defined()) doc = s.doc_start.data<int32_t>();
    if (s.key_valid.defined()) valid = s.key_valid.data<int32_t>();
    if (s.bias.defined()) {
      bias = s.bias.data<T>();
      bias_shared = s.bias.dim(0) == 1;
    }
    heads = s.total_heads > 0 ? s.total_heads : d.np;
    qpos = s.q_positions > 0 ? s.q_positions : d.sq;
    kvpos = s.kv_positions > 0 ? s.kv_positions : d.skv;
  }
  // First key row query row i may see by its document and the sliding window (0 without
  // either; may exceed skv).
  int64_t first_key(int64_t bb, int64_t i) const {
    int64_t first = doc ? doc[bb * d.sq + i] - spec.kv_offset : 0;
    if (spec.window >= 0) first = std::max(first, spec.q_offset + i - spec.window - spec.kv_offset);
    return std::max<int64_t>(first, 0);
  }
  // One past the last key row query row i may see causally (skv without the causal mask).
  int64_t end_key(int64_t i) const {
    return spec.causal ? std::clamp<int64_t>(spec.q_offset + i + 1 - spec.kv_offset, 0, d.skv)
                       : d.skv;
  }
  const T* bias_row(int64_t bb, int64_t h, int64_t i) const {
    return bias + (((bias_shared ? 0 : bb) * d.np + h) * d.sq + i) * d.skv;
  }
  // Keep-scale of element (bb, h, i, j) under attention dropout: 0 or 1/(1-p).
  float dropout_scale(int64_t bb, int64_t h, int64_t i, int64_t j) const {
    const uint64_t idx = static_cast<uint64_t>(
        ((bb * heads + spec.head_offset + h) * qpos + spec.q_offset + i) * kvpos + spec.kv_offset +
        j);
    const float u = Philox::uniform(spec.seed, spec.stream, idx);
    return u >= spec.dropout ? 1.0f / (1.0f - spec.dropout) : 0.0f;
  }
};

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

// Keys query row i may see inside the key tile starting at j0 (bk keys): [lo, hi) relative to
// j0 (empty when lo >= hi), further thinned by key padding (`valid`, per key of the tile).
struct KeyRange {
  int64_t lo, hi;
};
template <typename T>
inline KeyRange key_range(const Masking<T>& mk, int64_t bb, int64_t i, int64_t j0, int64_t bk) {
  const int64_t lo = std::max<int64_t>(mk.first_key(bb, i) - j0, 0);
  const int64_t hi = std::min<int64_t>(mk.end_key(i) - j0, bk);
  return {lo, hi};
}

// Per key of the tile at j0: 1 for a real key, 0 for padding or past the tile's end.
template <typename T>
void load_valid(T* dst, const Masking<T>& mk, int64_t bb, int64_t j0, int64_t bk) {
  for (int64_t jj = 0; jj < kTile; ++jj) {
    dst[jj] = jj < bk && (!mk.valid || mk.valid[bb * mk.d.skv + j0 + jj] != 0) ? T(1) : T(0);
  }
}

// bk rows of head `head` of a view from position j0, as a [kTile, hn] row tile or a transposed
// [hn, kTile] tile; the kTile - bk padding rows/columns are zero.
template <typename T>
void load_rows(T* dst, const Rows<T>& src, int64_t bb, int64_t head, int64_t j0, int64_t bk) {
  const int64_t hn = src.v.hn;
  std::fill(dst + bk * hn, dst + kTile * hn, T(0));
  for (int64_t jj = 0; jj < bk; ++jj) {
    if (jj + kAhead < bk) prefetch_row(src.at(j0 + jj + kAhead, bb, head), hn);
    const T* row = src.at(j0 + jj, bb, head);
    std::copy(row, row + hn, dst + jj * hn);
  }
}

template <typename T>
void load_transposed(T* dst, const Rows<T>& src, int64_t bb, int64_t head, int64_t j0, int64_t bk) {
  const int64_t hn = src.v.hn;
  if (bk < kTile) std::fill(dst, dst + hn * kTile, T(0));
  for (int64_t jj = 0; jj < bk; ++jj) {
    if (jj + kAhead < bk) prefetch_row(src.at(j0 + jj + kAhead, bb, head), hn);
    const T* row = src.at(j0 + jj, bb, head);
    for (int64_t c = 0; c < hn; ++c) dst[c * kTile + jj] = row[c];
  }
}

// dst[c, r] = src[r, c] for a [rows, cols] matrix of 32-bit words (bf16 pairs).
inline void transpose_words(uint32_t* dst, const uint32_t* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

template <typename T>
void forward_kernel(T* out, T* lse, float* max_logit, const Rows<T>& q, const Rows<T>& k,
                    const Rows<T>& v, const Dims& d, const Masking<T>& mk) {
  const int64_t qtiles = (d.sq + kTile - 1) / kTile, ktiles = (d.skv + kTile - 1) / kTile,
                hn = d.hn;
  const T scale = static_cast<T>(mk.spec.scale);
  const T neg_inf = static_cast<T>(kNegInf);
  const bool drop = mk.spec.dropout > 0;
  // Whole heads per task where there are enough of them to balance the threads (every key tile
  // loaded once per head); single query tiles otherwise (few heads, long sequences).
  const int64_t chunk = d.b * d.np >= 4 * num_threads() ? qtiles : 1;
  const bool bf = bf16_tiles<T>(mk.spec, hn);
  // The f32 tiles take q pre-scaled (S = q k^T is then the scaled score); the bf16 tiles round q
  // itself and scale S in f32, so that a scale that is no power of two rounds nothing more.
  const T qscale = bf ? T(1) : scale;
#pragma omp parallel
  {
    // One set of buffers per thread. The key tiles a thread has loaded for its current
    // (batch, head) (K transposed, V as rows, the padding flags) serve its next query tiles of
    // that head: causally query tile t reads t + 1 key tiles, so loading them per tile pair
    // would read each one qtiles / 2 times. Up to 8 MB of them per thread (4096 keys at head
    // size 128); longer sequences keep one tile, loaded at each use.
    const int64_t hp = hn / 2, tp = kTile / 2;
    const int64_t tile_bytes = kTile * hn * (2 * static_cast<int64_t>(sizeof(T)) + (bf ? 4 : 0));
    const bool keep = ktiles * tile_bytes <= (int64_t{8} << 20);
    const int64_t slots = keep ? ktiles : 1;
    std::vector<T> qs(kTile * hn), kt(slots * hn * kTile), vr(slots * kTile * hn),
        sc(kTile * kTile), o(kTile * hn), m(kTile), sum(kTile), valid(slots * kTile);
    std::vector<char> loaded(static_cast<size_t>(slots));
    int64_t cached = -1;  // the (batch, head) whose tiles `loaded` marks
    // bf16 tiles: q's rows, K^T and V as pairs per key tile, the probabilities' rows.
    std::vector<uint32_t> qa(bf ? kTile * hp : 0), ktv(bf ? slots * hp * kTile : 0),
        vv(bf ? slots * tp * hn : 0), pa(bf ? kTile * tp : 0);
    // The largest score of each head this thread saw (spec.max_logit): a row's running max
    // ends as the largest score it gave a visible key.
    std::vector<T> head_max(max_logit ? d.np : 0, neg_inf);
#pragma omp for collapse(3) schedule(dynamic, chunk) nowait
    for (int64_t bb = 0; bb < d.b; ++bb) {
      for (int64_t h = 0; h < d.np; ++h) {
        for (int64_t qt = 0; qt < qtiles; ++qt) {
          const int64_t g = h / d.qpg;
          if (bb * d.np + h != cached) {
            std::fill(loaded.begin(), loaded.end(), 0);
            cached = bb * d.np + h;
          }
          const int64_t i0 = qt * kTile, bq = std::min(kTile, d.sq - i0);
          // q pre-scaled, so that S = q k^T is already the scaled score.
          std::fill(qs.begin(), qs.end(), T(0));
          std::fill(o.begin(), o.end(), T(0));
          std::fill(m.begin(), m.end(), neg_inf);
          std::fill(sum.begin(), sum.end(), T(0));
          int64_t jlo = d.skv, jend = 0;
          for (int64_t r = 0; r < bq; ++r) {
            if (r + kAhead < bq) prefetch_row(q.at(i0 + r + kAhead, bb, h), hn);
            const T* src = q.at(i0 + r, bb, h);
            for (int64_t c = 0; c < hn; ++c) qs[r * hn + c] = qscale * src[c];
            jlo = std::min(jlo, mk.first_key(bb, i0 + r));
            jend = std::max(jend, mk.end_key(i0 + r));
          }
          if constexpr (kBf16Capable<T>) {
            if (bf) pack_rows_bf16(qa.data(), hp, qs.data(), hn, bq, hn);
          }
          for (int64_t j0 = jlo / kTile * kTile; j0 < jend; j0 += kTile) {
            const int64_t bk = std::min(kTile, d.skv - j0), t = keep ? j0 / kTile : 0;
            T* ktile = kt.data() + t * hn * kTile;
            T* vtile = vr.data() + t * kTile * hn;
            T* ok = valid.data() + t * kTile;
            if (!keep || !loaded[static_cast<size_t>(t)]) {
              load_transposed(ktile, k, bb, g, j0, bk);
              load_rows(vtile, v, bb, g, j0, bk);
              load_valid(ok, mk, bb, j0, bk);
              if constexpr (kBf16Capable<T>) {
                if (bf) {
                  pack_pairs_bf16(ktv.data() + t * hp * kTile, ktile, kTile, hn, kTile);
                  pack_pairs_bf16(vv.data() + t * tp * hn, vtile, hn, kTile, hn);
                }
              }
              loaded[static_cast<size_t>(t)] = 1;
            }
            std::fill(sc.begin(), sc.end(), T(0));
            if constexpr (kBf16Capable<T>) {
              if (bf) {
                tile_gemm_bf16<false>(sc.data(), kTile, qa.data(), hp, ktv.data() + t * hp * kTile,
                                      bq, kTile, hp);
                for (int64_t e = 0; e < bq * kTile; ++e) sc[e] *= scale;
              }
            }
            if (!bf) cpu::tile_gemm(sc.data(), kTile, qs.data(), hn, ktile, kTile, bq, kTile, hn);
            for (int64_t r = 0; r < bq; ++r) {
              const int64_t i = i0 + r;
              const KeyRange kr = key_range(mk, bb, i, j0, bk);
              T* row = sc.data() + r * kTile;
              if (kr.lo >= kr.hi) {
                std::fill(row, row + kTile, T(0));
                continue;
              }
              if (mk.bias) {
                const T* br = mk.bias_row(bb, h, i) + j0;
                for (int64_t jj = 0; jj < bk; ++jj) row[jj] += br[jj];
              }
              // Selects, so that it vectorises (a branch per key did not); max is exact, so
              // the order of the comparisons changes nothing.
              T tile_max = neg_inf;
#pragma omp simd reduction(max : tile_max)
              for (int64_t jj = kr.lo; jj < kr.hi; ++jj) {
                const T x = ok[jj] != T(0) ? row[jj] : neg_inf;
                tile_max = x > tile_max ? x : tile_max;
              }
              if (tile_max == neg_inf) {  // every visible key of the tile is padding
                std::fill(row, row + kTile, T(0));
                continue;
              }
              const T m_new = std::max(m[r], tile_max);
              const T alpha = m[r] == neg_inf ? T(0) : cpu::vexp(m[r] - m_new);
              const int64_t lo = kr.lo, hi = kr.hi;
              T part = 0;
#pragma omp simd reduction(+ : part)
              for (int64_t jj = 0; jj < kTile; ++jj) {
                const T p =
                    jj >= lo && jj < hi && ok[jj] != T(0) ? cpu::vexp(row[jj] - m_new) : T(0);
                row[jj] = p;
                part += p;
              }
              sum[r] = sum[r] * alpha + part;
              m[r] = m_new;
              if (drop) {
                for (int64_t jj = lo; jj < hi; ++jj) row[jj] *= mk.dropout_scale(bb, h, i, j0 + jj);
              }
              T* orow = o.data() + r * hn;
#pragma omp simd
              for (int64_t c = 0; c < hn; ++c) orow[c] *= alpha;
            }
            if constexpr (kBf16Capable<T>) {
              if (bf) {
                pack_rows_bf16(pa.data(), tp, sc.data(), kTile, bq, kTile);
                tile_gemm_bf16<false>(o.data(), hn, pa.data(), tp, vv.data() + t * tp * hn, bq, hn,
                                      tp);
              }
            }
            if (!bf) cpu::tile_gemm(o.data(), hn, sc.data(), kTile, vtile, hn, bq, hn, kTile);
          }
          for (int64_t r = 0; r < bq; ++r) {
            if (r + kAhead < bq) prefetch_row(out + d.o_off(i0 + r + kAhead, bb, h), hn, true);
            T* dst = out + d.o_off(i0 + r, bb, h);
            if (sum[r] == T(0)) {  // the row saw no key
              std::fill(dst, dst + hn, T(0));
              lse[d.lse_off(i0 + r, bb, h)] = neg_inf;
              continue;
            }
            const T inv = 1 / sum[r];
            for (int64_t c = 0; c < hn; ++c) dst[c] = o[r * hn + c] * inv;
            lse[d.lse_off(i0 + r, bb, h)] = m[r] + std::log(sum[r]);
            if (max_logit) head_max[h] = std::max(head_max[h], m[r]);
          }
        }
      }
    }
    if (max_logit) {
#pragma omp critical(attention_max_logit)
      for (int64_t h = 0; h < d.np; ++h) {
        max_logit[h] = std::max(max_logit[h], static_cast<float>(head_max[h]));
      }
    }
  }
}

template <typename T>
void backward_kernel(const Rows<T>& dq_out, const Rows<T>& dk_out, const Rows<T>& dv_out, T* dbias,
                     const T* dout, const Rows<T>& q, const Rows<T>& k, const Rows<T>& v,
                     const T* out, const T* lse, const Dims& d, const Masking<T>& mk) {
  const int64_t hn = d.hn, qtiles = (d.sq + kTile - 1) / kTile;
  const int64_t sqp = qtiles * kTile, skvp = (d.skv + kTile - 1) / kTile * kTile;
  const T scale = static_cast<T>(mk.spec.scale);
  const T neg_inf = static_cast<T>(kNegInf);
  const bool drop = mk.spec.dropout > 0;
  // With grouped queries, each (batch, head) task leaves its dK and dV contributions, [skvp, hn]
  // each, for the sum over the group below; with one query head per group a task owns its
  // group's dK and dV and writes them itself (no buffer the size of dK and dV).
  const size_t kv_block = static_cast<size_t>(skvp * hn);
  const bool grouped = d.qpg > 1;
  const size_t parts = grouped ? static_cast<size_t>(d.b * d.np) * kv_block : 0;
  std::vector<T> dk_part(parts), dv_part(parts);
  // A bias shared over the batch gets one gradient per (batch, head), summed below in order.
  const bool bias_sum = dbias && mk.bias_shared && d.b > 1;
  const size_t head_scores = static_cast<size_t>(d.sq * d.skv);
  std::vector<T> dbias_part(bias_sum ? static_cast<size_t>(d.b * d.np) * head_scores : 0);

  const size_t q_block = static_cast<size_t>(sqp * hn);
  const bool bf = bf16_tiles<T>(mk.spec, hn);
  const T qscale = bf ? T(1) : scale;  // as in forward: the bf16 tiles scale S and dK in f32
#pragma omp parallel
  {
    // One set of buffers per thread, reused by its tasks (allocating them per task made the
    // allocator hand memory back and fault it in again every time). The query-side blocks'
    // rows >= sq stay zero: no task writes them.
    std::vector<T> own_k(grouped ? 0 : kv_block), own_v(own_k.size());
    std::vector<T> qs(q_block, T(0)), go(q_block, T(0)), dq(q_block);
    std::vector<T> L(static_cast<size_t>(d.sq)), D(static_cast<size_t>(d.sq));
    std::vector<int64_t> tile_first(static_cast<size_t>(qtiles));
    std::vector<T> kt(hn * kTile), vt(hn * kTile), kr(kTile * hn), p(kTile * kTile),
        dp(kTile * kTile), valid(kTile);
    // bf16 tiles: the head's q and dout as rows (S, dP) and as pairs (dK, dV); per key tile K^T,
    // V^T and K as pairs; per tile pair the dropped-out probabilities and dS as pairs (dV, dK)
    // and dS as rows (dQ).
    const int64_t hp = hn / 2, tp = kTile / 2;
    const auto words = [&](int64_t n) { return bf ? static_cast<size_t>(n) : size_t{0}; };
    std::vector<uint32_t> qa(words(sqp * hp)), ga(qa.size()), qv(qa.size()), gv(qa.size()),
        ktv(words(hp * kTile)), vtv(ktv.size()), krv(words(tp * hn)), pv(words(tp * kTile)),
        dsv(pv.size()), dsa(pv.size()), rows_words(ktv.size());

#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t bb = 0; bb < d.b; ++bb) {
      for (int64_t h = 0; h < d.np; ++h) {
        const int64_t g = h / d.qpg;
        T* dk = grouped ? dk_part.data() + (bb * d.np + h) * kv_block : own_k.data();
        T* dv = grouped ? dv_part.data() + (bb * d.np + h) * kv_block : own_v.data();
        std::fill(dk, dk + kv_block, T(0));
        std::fill(dv, dv + kv_block, T(0));
        T* db = nullptr;  // this (batch, head)'s [sq, skv] bias gradient
        if (dbias) {
          db = bias_sum ? dbias_part.data() + (bb * d.np + h) * head_scores
                        : dbias + ((mk.bias_shared ? 0 : bb) * d.np + h) * head_scores;
          std::fill(db, db + head_scores, T(0));
        }
        // The head's queries (pre-scaled for the f32 tiles, as in forward) and output
        // gradients, rows >= sq zero.
        std::fill(dq.begin(), dq.end(), T(0));
        // Per query tile: the first key row any of its rows sees.
        std::fill(tile_first.begin(), tile_first.end(), d.skv);
        for (int64_t i = 0; i < d.sq; ++i) {
          if (i + kAhead < d.sq) {
            prefetch_row(q.at(i + kAhead, bb, h), hn);
            prefetch_row(dout + d.o_off(i + kAhead, bb, h), hn);
            prefetch_row(out + d.o_off(i + kAhead, bb, h), hn);
          }
          const T* qi = q.at(i, bb, h);
          const T* gi = dout + d.o_off(i, bb, h);
          for (int64_t c = 0; c < hn; ++c) qs[i * hn + c] = qscale * qi[c];
          std::copy(gi, gi + hn, go.data() + i * hn);
          L[i] = lse[d.lse_off(i, bb, h)];
          D[i] = dot(gi, out + d.o_off(i, bb, h), hn);
          tile_first[i / kTile] = std::min(tile_first[i / kTile], mk.first_key(bb, i));
        }
        if constexpr (kBf16Capable<T>) {
          if (bf) {
            pack_rows_bf16(qa.data(), hp, qs.data(), hn, sqp, hn);
            pack_rows_bf16(ga.data(), hp, go.data(), hn, sqp, hn);
            pack_pairs_bf16(qv.data(), qs.data(), hn, sqp, hn);
            pack_pairs_bf16(gv.data(), go.data(), hn, sqp, hn);
          }
        }
        for (int64_t j0 = 0; j0 < d.skv; j0 += kTile) {
          const int64_t bk = std::min(kTile, d.skv - j0);
          load_rows(kr.data(), k, bb, g, j0, bk);
          load_valid(valid.data(), mk, bb, j0, bk);
          if (!bf) {
            load_transposed(kt.data(), k, bb, g, j0, bk);
            load_transposed(vt.data(), v, bb, g, j0, bk);
          }
          if constexpr (kBf16Capable<T>) {
            if (bf) {
              // K^T and V^T in pairs layout are the word transposes of K's and V's rows layout:
              // word (p, j) = (K[j, 2p], K[j, 2p + 1]). V's rows go through vt's storage.
              pack_rows_bf16(rows_words.data(), hp, kr.data(), hn, kTile, hn);
              transpose_words(ktv.data(), rows_words.data(), kTile, hp);
              load_rows(vt.data(), v, bb, g, j0, bk);
              pack_rows_bf16(rows_words.data(), hp, vt.data(), hn, kTile, hn);
              transpose_words(vtv.data(), rows_words.data(), kTile, hp);
              pack_pairs_bf16(krv.data(), kr.data(), hn, kTile, hn);
            }
          }
          // Causally, the first query row that can see key row j0 is j0 + kv_offset - q_offset.
          const int64_t first_row =
              mk.spec.causal
                  ? std::max<int64_t>(j0 + mk.spec.kv_offset - mk.spec.q_offset, 0) / kTile * kTile
                  : 0;
          for (int64_t i0 = first_row; i0 < d.sq; i0 += kTile) {
            if (tile_first[i0 / kTile] >= j0 + bk) continue;  // no row sees this key tile
            const int64_t bq = std::min(kTile, d.sq - i0);
            std::fill(p.begin(), p.end(), T(0));
            std::fill(dp.begin(), dp.end(), T(0));
            if constexpr (kBf16Capable<T>) {
              if (bf) {
                tile_gemm_bf16<false>(p.data(), kTile, qa.data() + i0 * hp, hp, ktv.data(), bq,
                                      kTile, hp);
                for (int64_t e = 0; e < bq * kTile; ++e) p[e] *= scale;
                tile_gemm_bf16<false>(dp.data(), kTile, ga.data() + i0 * hp, hp, vtv.data(), bq,
                                      kTile, hp);
              }
            }
            if (!bf) {
              cpu::tile_gemm(p.data(), kTile, qs.data() + i0 * hn, hn, kt.data(), kTile, bq, kTile,
                             hn);
              cpu::tile_gemm(dp.data(), kTile, go.data() + i0 * hn, hn, vt.data(), kTile, bq, kTile,
                             hn);
            }
            // p becomes the dropped-out probabilities (for dV), dp becomes dS.
            for (int64_t r = 0; r < bq; ++r) {
              const int64_t i = i0 + r;
              const KeyRange range = key_range(mk, bb, i, j0, bk);
              const int64_t lo = range.lo, hi = L[i] == neg_inf ? 0 : range.hi;
              const T li = L[i], di = D[i];
              T* prow = p.data() + r * kTile;
              T* drow = dp.data() + r * kTile;
              if (mk.bias && lo < hi) {
                const T* br = mk.bias_row(bb, h, i) + j0;
                for (int64_t jj = 0; jj < bk; ++jj) prow[jj] += br[jj];
              }
              const T* ok = valid.data();
              if (!drop) {
#pragma omp simd
                for (int64_t jj = 0; jj < kTile; ++jj) {
                  const T pr =
                      jj >= lo && jj < hi && ok[jj] != T(0) ? cpu::vexp(prow[jj] - li) : T(0);
                  prow[jj] = pr;
                  drow[jj] = pr * (drow[jj] - di);
                }
              } else {
                for (int64_t jj = 0; jj < kTile; ++jj) {
                  if (jj < lo || jj >= hi || ok[jj] == T(0)) {
                    prow[jj] = drow[jj] = 0;
                    continue;
                  }
                  const T pr = cpu::vexp(prow[jj] - li);
                  const T keep = static_cast<T>(mk.dropout_scale(bb, h, i, j0 + jj));
                  prow[jj] = pr * keep;
                  drow[jj] = pr * (keep * drow[jj] - di);
                }
              }
              if (db) std::copy(drow, drow + bk, db + i * d.skv + j0);
            }
            // dV += Pd^T dO, dK += dS^T (scale q), dQ += dS K (scale applied when written).
            if constexpr (kBf16Capable<T>) {
              if (bf) {
                const int64_t pairs = (bq + 1) / 2;
                pack_pairs_bf16(pv.data(), p.data(), kTile, bq, kTile);
                pack_pairs_bf16(dsv.data(), dp.data(), kTile, bq, kTile);
                pack_rows_bf16(dsa.data(), tp, dp.data(), kTile, bq, kTile);
                tile_gemm_bf16<true>(dv + j0 * hn, hn, pv.data(), kTile, gv.data() + i0 / 2 * hn,
                                     kTile, hn, pairs);
                tile_gemm_bf16<true>(dk + j0 * hn, hn, dsv.data(), kTile, qv.data() + i0 / 2 * hn,
                                     kTile, hn, pairs);
                tile_gemm_bf16<false>(dq.data() + i0 * hn, hn, dsa.data(), tp, krv.data(), bq, hn,
                                      tp);
                continue;
              }
            }
            cpu::tile_gemm_at(dv + j0 * hn, hn, p.data(), kTile, go.data() + i0 * hn, hn, kTile, hn,
                              bq);
            cpu::tile_gemm_at(dk + j0 * hn, hn, dp.data(), kTile, qs.data() + i0 * hn, hn, kTile,
                              hn, bq);
            cpu::tile_gemm(dq.data() + i0 * hn, hn, dp.data(), kTile, kr.data(), hn, bq, hn, kTile);
          }
        }
        if (bf) {  // dK summed dS^T q of the unscaled q
          for (size_t e = 0; e < kv_block; ++e) dk[e] *= scale;
        }
        for (int64_t i = 0; i < d.sq; ++i) {
          if (i + kAhead < d.sq) prefetch_row(dq_out.at(i + kAhead, bb, h), hn, true);
          T* dst = dq_out.at(i, bb, h);
          for (int64_t c = 0; c < hn; ++c) dst[c] = scale * dq[i * hn + c];
        }
        if (!grouped) {
          for (int64_t j = 0; j < d.skv; ++j) {
            if (j + kAhead < d.skv) {
              prefetch_row(dk_out.at(j + kAhead, bb, g), hn, true);
              prefetch_row(dv_out.at(j + kAhead, bb, g), hn, true);
            }
            std::copy(dk + j * hn, dk + (j + 1) * hn, dk_out.at(j, bb, g));
            std::copy(dv + j * hn, dv + (j + 1) * hn, dv_out.at(j, bb, g));
          }
        }
      }
    }
  }
  if (grouped) {
    // dK and dV of each group: its heads' contributions in head order.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bb = 0; bb < d.b; ++bb) {
      for (int64_t g = 0; g < d.ng; ++g) {
        for (int64_t j = 0; j < d.skv; ++j) {
          T* dkj = dk_out.at(j, bb, g);
          T* dvj = dv_out.at(j, bb, g);
          std::fill(dkj, dkj + hn, T(0));
          std::fill(dvj, dvj + hn, T(0));
          for (int64_t jq = 0; jq < d.qpg; ++jq) {
            const size_t at = (bb * d.np + g * d.qpg + jq) * kv_block + j * hn;
            for (int64_t c = 0; c < hn; ++c) {
              dkj[c] += dk_part[at + c];
              dvj[c] += dv_part[at + c];
            }
          }
        }
      }
    }
  }
  if (bias_sum) {
    // The shared bias's gradient: every sequence's, summed in batch order.
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < d.np; ++h) {
      T* dst = dbias + h * head_scores;
      std::fill(dst, dst + head_scores, T(0));
      for (int64_t bb = 0; bb < d.b; ++bb) {
        const T* src = dbias_part.data() + (bb * d.np + h) * head_scores;
        for (size_t e = 0; e < head_scores; ++e) dst[e] += src[e];
      }
    }
  }
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec) {
  const Dims d = make_dims(q, k, v, spec);
  check_shape(out, {d.sq, d.b, d.np, d.hn}, "attention_forward out");
  check_shape(lse, {d.b, d.np, d.sq}, "attention_forward lse");
  MEGATRON_CHECK(out.dtype() == q.tensor.dtype() && lse.dtype() == q.tensor.dtype(),
                 "attention_forward: out and lse must have q's dtype");
  cpu::dispatch_float(q.tensor, "attention_forward", [&]<typename T>() {
    const Masking<T> mk(spec, d);
    float* max_logit = spec.max_logit.defined() ? spec.max_logit.data<float>() : nullptr;
    forward_kernel<T>(out.data<T>(), lse.data<T>(), max_logit, rows<T>(q), rows<T>(k), rows<T>(v),
                      d, mk);
  });
}

void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec) {
  const Dims d = make_dims(q, k, v, spec);
  const Dims dd = make_dims(dq, dk, dv, AttentionSpec{});
  MEGATRON_CHECK(dd.sq == d.sq && dd.skv == d.skv && dd.b == d.b && dd.np == d.np &&
                     dd.ng == d.ng && dd.hn == d.hn && dq.tensor.dtype() == q.tensor.dtype(),
                 "attention_backward: dq, dk, dv must be shaped as q, k, v");
  check_shape(dout, {d.sq, d.b, d.np, d.hn}, "attention_backward dout");
  check_shape(out, {d.sq, d.b, d.np, d.hn}, "attention_backward out");
  check_shape(lse, {d.b, d.np, d.sq}, "attention_backward lse");
  if (dbias.defined()) {
    MEGATRON_CHECK(spec.bias.defined(), "attention_backward: dbias without a bias");
    check_shape(dbias, spec.bias.shape(), "attention_backward dbias");
  }
  cpu::dispatch_float(q.tensor, "attention_backward", [&]<typename T>() {
    const Masking<T> mk(spec, d);
    backward_kernel<T>(rows<T>(dq), rows<T>(dk), rows<T>(dv),
                       dbias.defined() ? dbias.data<T>() : nullptr, dout.data<T>(), rows<T>(q),
                       rows<T>(k), rows<T>(v), out.data<T>(), lse.data<T>(), d, mk);
  });
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  MEGATRON_CHECK(out.ndim() == 4, "attention_merge: out must be [sq, b, np, hn], got ", out.str());
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  check_shape(out_b, out.shape(), "attention_merge out_b");
  check_shape(lse, {b, np, sq}, "attention_merge lse");
  check_shape(lse_b, {b, np, sq}, "attention_merge lse_b");
  cpu::dispatch_float(out, "attention_merge", [&]<typename T>() {
    T* o = out.data<T>();
    T* l = lse.data<T>();
    const T* ob = out_b.data<T>();
    const T* lb = lse_b.data<T>();
    const T neg_inf = static_cast<T>(kNegInf);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bb = 0; bb < b; ++bb) {
      for (int64_t h = 0; h < np; ++h) {
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t li = (bb * np + h) * sq + i;
          const T la = l[li], lbv = lb[li];
          if (lbv == neg_inf) continue;  // B saw no key: A's result stands
          T* oa = o + ((i * b + bb) * np + h) * hn;
          const T* obr = ob + ((i * b + bb) * np + h) * hn;
          if (la == neg_inf) {
            std::copy(obr, obr + hn, oa);
            l[li] = lbv;
            continue;
          }
          const T mx = std::max(la, lbv);
          const T wa = std::exp(la - mx), wb = std::exp(lbv - mx), z = wa + wb;
          for (int64_t c = 0; c < hn; ++c) oa[c] = (wa * oa[c] + wb * obr[c]) / z;
          l[li] = mx + std::log(z);
        }
      }
    }
  });
}

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink) {
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  cpu::dispatch_float(out, "attention_sink_forward", [&]<typename T>() {
    T* o = out.data<T>();
    T* l = lse.data<T>();
    const T* s = sink.data<T>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t bb = 0; bb < b; ++bb) {
      for (int64_t h = 0; h < np; ++h) {
        for (int64_t i = 0; i < sq; ++i) {
          T& li = l[(bb * np + h) * sq + i];
          // lse' = logaddexp(lse, sink); a row that saw no key keeps out = 0.
          const T mx = std::max(li, s[h]);
          const T merged = mx + std::log(std::exp(li - mx) + std::exp(s[h] - mx));
          const T f = std::exp(li - merged);
          T* row = o + ((i * b + bb) * np + h) * hn;
          for (int64_t c = 0; c < hn; ++c) row[c] *= f;
          li = merged;
        }
      }
    }
  });
}

void attention_sink_backward(Tensor& dsink, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& sink) {
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  cpu::dispatch_float(out, "attention_sink_backward", [&]<typename T>() {
    const T* o = out.data<T>();
    const T* d = dout.data<T>();
    const T* l = lse.data<T>();
    const T* s = sink.data<T>();
    T* ds = dsink.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < np; ++h) {
      double acc = 0;  // a sum over every row of the head: in double, in a fixed order
      for (int64_t bb = 0; bb < b; ++bb) {
        for (int64_t i = 0; i < sq; ++i) {
          const int64_t at = ((i * b + bb) * np + h) * hn;
          const T p = std::exp(s[h] - l[(bb * np + h) * sq + i]);
          acc -= static_cast<double>(p * dot(d + at, o + at, hn));
        }
      }
      ds[h] = static_cast<T>(acc);
    }
  });
}

}  // namespace megatron::cpu
