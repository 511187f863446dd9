// Tiled scaled-dot-product attention with an online softmax (FlashAttention-2 style) on CPU.
//
// Forward walks 64-key tiles for a 64-row block of queries, keeping a running max and sum per row,
// so no s x s score matrix ever exists; it keeps only out and the per-row log-sum-exp. Backward
// recomputes probabilities from lse: P_ij = exp(scale q_i.k_j - lse_i), and with
// D_i = dO_i . O_i (equal to sum_j P_ij dP_ij, dropout included):
//   dV_j += Pd_ij dO_i,  dP_ij = mask_ij/(1-p) dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
//   dQ_i += scale dS_ij k_j,  dK_j += scale dS_ij q_i.
// Every product of tiles (S = Q K^T, O += P V, dP = dO V^T, dV += Pd^T dO, dK += dS^T Q,
// dQ += dS K) is a register-blocked tile GEMM (tile_gemm.h) on tiles copied out of the packed
// QKV layout into contiguous buffers, K and V transposed where the product needs them so.
//
// Parallelism: forward over (batch, head, query tile); backward over (batch, head), one task
// owning its head's dQ and its dK/dV contributions; with grouped queries those are then summed
// over the heads of each group in a fixed order. No atomics, no per-thread copies: results do
// not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/philox.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/tile_gemm.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron::ops {
namespace {

constexpr int64_t kTile = 64;  // query rows and key columns per tile

// Strided access into the packed QKV buffer and the output.
struct Layout {
  int64_t s, b, ng, qpg, hn, np;
  int64_t P() const { return qpg + 2; }
  int64_t token_stride() const { return ng * P() * hn; }  // between (t, bb) and (t, bb + 1)
  int64_t q_off(int64_t t, int64_t bb, int64_t h) const {
    int64_t g = h / qpg, jq = h % qpg;
    return (t * b + bb) * token_stride() + (g * P() + jq) * hn;
  }
  int64_t k_off(int64_t t, int64_t bb, int64_t g) const {
    return (t * b + bb) * token_stride() + (g * P() + qpg) * hn;
  }
  int64_t v_off(int64_t t, int64_t bb, int64_t g) const { return k_off(t, bb, g) + hn; }
  int64_t o_off(int64_t t, int64_t bb, int64_t h) const { return ((t * b + bb) * np + h) * hn; }
  int64_t lse_off(int64_t t, int64_t bb, int64_t h) const { return (bb * np + h) * s + t; }
};

Layout make_layout(const Tensor& qkv, const AttentionSpec& spec) {
  MEGATRON_CHECK(qkv.ndim() == 5 && qkv.dim(2) == spec.num_query_groups &&
                     qkv.dim(3) == spec.queries_per_group + 2,
                 "attention: qkv must be [s, b, ng, qpg + 2, hn] with ng = ", spec.num_query_groups,
                 ", qpg = ", spec.queries_per_group, "; got ", qkv.str());
  MEGATRON_CHECK(!spec.doc_start || spec.causal, "attention: document masks need causal attention");
  Layout l{qkv.dim(0), qkv.dim(1), spec.num_query_groups, spec.queries_per_group, qkv.dim(4), 0};
  l.np = l.ng * l.qpg;
  return l;
}

// Keep-scale of element (bb, h, i, j) under attention dropout: 0 or 1/(1-p).
inline float dropout_scale(const AttentionSpec& spec, const Layout& l, int64_t bb, int64_t h,
                           int64_t i, int64_t j) {
  const int64_t heads = spec.total_heads > 0 ? spec.total_heads : l.np;
  uint64_t idx = static_cast<uint64_t>(((bb * heads + spec.head_offset + h) * l.s + i) * l.s + j);
  float u = Philox::uniform(spec.seed, spec.stream, idx);
  return u >= spec.dropout ? 1.0f / (1.0f - spec.dropout) : 0.0f;
}

// First key position query i of sequence bb may attend to (document start, or 0).
inline int64_t first_key(const AttentionSpec& spec, const Layout& l, int64_t bb, int64_t i) {
  return spec.doc_start ? spec.doc_start[bb * l.s + i] : 0;
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

// Keys query i may attend to inside the key tile starting at j0 (bk keys): [lo, hi), relative to
// j0; empty when lo >= hi.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange key_range(const AttentionSpec& spec, const Layout& l, int64_t bb, int64_t i,
                          int64_t j0, int64_t bk) {
  const int64_t lo = std::max<int64_t>(first_key(spec, l, bb, i) - j0, 0);
  const int64_t hi = spec.causal ? std::min<int64_t>(i + 1 - j0, bk) : bk;
  return {lo, hi};
}

// The bk keys (slot 0) or values (slot 1) of (bb, group g) from position j0, as a [kTile, hn]
// row tile or a transposed [hn, kTile] tile; the kTile - bk padding rows/columns are zero.
template <typename T>
void load_rows(T* dst, const T* qkv, const Layout& l, int64_t bb, int64_t g, int64_t j0, int64_t bk,
               int slot) {
  std::fill(dst + bk * l.hn, dst + kTile * l.hn, T(0));
  for (int64_t jj = 0; jj < bk; ++jj) {
    const T* src = qkv + l.k_off(j0 + jj, bb, g) + slot * l.hn;
    std::copy(src, src + l.hn, dst + jj * l.hn);
  }
}

template <typename T>
void load_transposed(T* dst, const T* qkv, const Layout& l, int64_t bb, int64_t g, int64_t j0,
                     int64_t bk, int slot) {
  if (bk < kTile) std::fill(dst, dst + l.hn * kTile, T(0));
  for (int64_t jj = 0; jj < bk; ++jj) {
    const T* src = qkv + l.k_off(j0 + jj, bb, g) + slot * l.hn;
    for (int64_t c = 0; c < l.hn; ++c) dst[c * kTile + jj] = src[c];
  }
}

template <typename T>
void forward_kernel(T* out, T* lse, const T* qkv, const Layout& l, const AttentionSpec& spec) {
  const int64_t ntiles = (l.s + kTile - 1) / kTile, hn = l.hn;
  const T scale = static_cast<T>(spec.scale);
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t h = 0; h < l.np; ++h) {
      for (int64_t qt = 0; qt < ntiles; ++qt) {
        const int64_t g = h / l.qpg, i0 = qt * kTile, bq = std::min(kTile, l.s - i0);
        // q pre-scaled, so that S = q k^T is already the scaled score.
        std::vector<T> q(kTile * hn, T(0)), kt(hn * kTile), v(kTile * hn), sc(kTile * kTile),
            o(kTile * hn, T(0)), m(kTile, -std::numeric_limits<T>::infinity()), sum(kTile, T(0));
        int64_t jlo = l.s;
        for (int64_t r = 0; r < bq; ++r) {
          const T* src = qkv + l.q_off(i0 + r, bb, h);
          for (int64_t c = 0; c < hn; ++c) q[r * hn + c] = scale * src[c];
          jlo = std::min(jlo, first_key(spec, l, bb, i0 + r));
        }
        const int64_t jend = spec.causal ? i0 + bq : l.s;
        for (int64_t j0 = jlo / kTile * kTile; j0 < jend; j0 += kTile) {
          const int64_t bk = std::min(kTile, l.s - j0);
          load_transposed(kt.data(), qkv, l, bb, g, j0, bk, 0);
          load_rows(v.data(), qkv, l, bb, g, j0, bk, 1);
          std::fill(sc.begin(), sc.end(), T(0));
          cpu::tile_gemm(sc.data(), kTile, q.data(), hn, kt.data(), kTile, bq, kTile, hn);
          for (int64_t r = 0; r < bq; ++r) {
            const int64_t i = i0 + r;
            const KeyRange kr = key_range(spec, l, bb, i, j0, bk);
            T* row = sc.data() + r * kTile;
            if (kr.lo >= kr.hi) {
              std::fill(row, row + kTile, T(0));
              continue;
            }
            T tile_max = -std::numeric_limits<T>::infinity();
            for (int64_t jj = kr.lo; jj < kr.hi; ++jj) tile_max = std::max(tile_max, row[jj]);
            const T m_new = std::max(m[r], tile_max);
            const T alpha =
                m[r] == -std::numeric_limits<T>::infinity() ? T(0) : cpu::vexp(m[r] - m_new);
            const int64_t lo = kr.lo, hi = kr.hi;
            T part = 0;
#pragma omp simd reduction(+ : part)
            for (int64_t jj = 0; jj < kTile; ++jj) {
              const T p = jj >= lo && jj < hi ? cpu::vexp(row[jj] - m_new) : T(0);
              row[jj] = p;
              part += p;
            }
            sum[r] = sum[r] * alpha + part;
            m[r] = m_new;
            if (spec.dropout > 0) {
              for (int64_t jj = lo; jj < hi; ++jj)
                row[jj] *= dropout_scale(spec, l, bb, h, i, j0 + jj);
            }
            T* orow = o.data() + r * hn;
#pragma omp simd
            for (int64_t c = 0; c < hn; ++c) orow[c] *= alpha;
          }
          cpu::tile_gemm(o.data(), hn, sc.data(), kTile, v.data(), hn, bq, hn, kTile);
        }
        for (int64_t r = 0; r < bq; ++r) {
          T* dst = out + l.o_off(i0 + r, bb, h);
          const T inv = 1 / sum[r];
          for (int64_t c = 0; c < hn; ++c) dst[c] = o[r * hn + c] * inv;
          lse[l.lse_off(i0 + r, bb, h)] = m[r] + std::log(sum[r]);
        }
      }
    }
  }
}

template <typename T>
void backward_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                     const Layout& l, const AttentionSpec& spec) {
  const int64_t ntiles = (l.s + kTile - 1) / kTile, hn = l.hn, sp = ntiles * kTile;
  const T scale = static_cast<T>(spec.scale);
  const bool drop = spec.dropout > 0;
  // With grouped queries, each (batch, head) task leaves its dK and dV contributions, [sp, hn]
  // each, for the sum over the group below; with one query head per group a task owns its
  // group's dK and dV and writes them itself (no buffer the size of dK and dV).
  const size_t head_block = static_cast<size_t>(sp * hn);
  const bool grouped = l.qpg > 1;
  const size_t parts = grouped ? static_cast<size_t>(l.b * l.np) * head_block : 0;
  std::vector<T> dk_part(parts), dv_part(parts);

#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t h = 0; h < l.np; ++h) {
      const int64_t g = h / l.qpg;
      std::vector<T> own_k(grouped ? 0 : head_block, T(0)), own_v(own_k.size(), T(0));
      T* dk = grouped ? dk_part.data() + (bb * l.np + h) * head_block : own_k.data();
      T* dv = grouped ? dv_part.data() + (bb * l.np + h) * head_block : own_v.data();
      if (grouped) {
        std::fill(dk, dk + head_block, T(0));
        std::fill(dv, dv + head_block, T(0));
      }
      // The head's queries (pre-scaled, as in forward) and output gradients, rows >= s zero.
      std::vector<T> qs(head_block, T(0)), go(head_block, T(0)), dq(head_block, T(0));
      std::vector<T> L(static_cast<size_t>(l.s)), D(static_cast<size_t>(l.s));
      std::vector<int64_t> tile_first(static_cast<size_t>(ntiles), l.s);
      for (int64_t i = 0; i < l.s; ++i) {
        const T* q = qkv + l.q_off(i, bb, h);
        const T* gi = dout + l.o_off(i, bb, h);
        for (int64_t c = 0; c < hn; ++c) qs[i * hn + c] = scale * q[c];
        std::copy(gi, gi + hn, go.data() + i * hn);
        L[i] = lse[l.lse_off(i, bb, h)];
        D[i] = dot(gi, out + l.o_off(i, bb, h), hn);
        tile_first[i / kTile] = std::min(tile_first[i / kTile], first_key(spec, l, bb, i));
      }
      std::vector<T> kt(hn * kTile), vt(hn * kTile), kr(kTile * hn), p(kTile * kTile),
          dp(kTile * kTile);
      for (int64_t j0 = 0; j0 < l.s; j0 += kTile) {
        const int64_t bk = std::min(kTile, l.s - j0);
        load_transposed(kt.data(), qkv, l, bb, g, j0, bk, 0);
        load_transposed(vt.data(), qkv, l, bb, g, j0, bk, 1);
        load_rows(kr.data(), qkv, l, bb, g, j0, bk, 0);
        for (int64_t i0 = spec.causal ? j0 : 0; i0 < l.s; i0 += kTile) {
          if (tile_first[i0 / kTile] >= j0 + bk) continue;  // no row sees this key tile
          const int64_t bq = std::min(kTile, l.s - i0);
          std::fill(p.begin(), p.end(), T(0));
          std::fill(dp.begin(), dp.end(), T(0));
          cpu::tile_gemm(p.data(), kTile, qs.data() + i0 * hn, hn, kt.data(), kTile, bq, kTile, hn);
          cpu::tile_gemm(dp.data(), kTile, go.data() + i0 * hn, hn, vt.data(), kTile, bq, kTile,
                         hn);
          // p becomes the dropped-out probabilities (for dV), dp becomes dS.
          for (int64_t r = 0; r < bq; ++r) {
            const int64_t i = i0 + r;
            const KeyRange range = key_range(spec, l, bb, i, j0, bk);
            const int64_t lo = range.lo, hi = range.hi;
            const T li = L[i], di = D[i];
            T* prow = p.data() + r * kTile;
            T* drow = dp.data() + r * kTile;
            if (!drop) {
#pragma omp simd
              for (int64_t jj = 0; jj < kTile; ++jj) {
                const T pr = jj >= lo && jj < hi ? cpu::vexp(prow[jj] - li) : T(0);
                prow[jj] = pr;
                drow[jj] = pr * (drow[jj] - di);
              }
            } else {
              for (int64_t jj = 0; jj < kTile; ++jj) {
                if (jj < lo || jj >= hi) {
                  prow[jj] = drow[jj] = 0;
                  continue;
                }
                const T pr = cpu::vexp(prow[jj] - li);
                const T keep = static_cast<T>(dropout_scale(spec, l, bb, h, i, j0 + jj));
                prow[jj] = pr * keep;
                drow[jj] = pr * (keep * drow[jj] - di);
              }
            }
          }
          // dV += Pd^T dO, dK += dS^T (scale q), dQ += dS K (scale applied when written).
          cpu::tile_gemm_at(dv + j0 * hn, hn, p.data(), kTile, go.data() + i0 * hn, hn, kTile, hn,
                            bq);
          cpu::tile_gemm_at(dk + j0 * hn, hn, dp.data(), kTile, qs.data() + i0 * hn, hn, kTile, hn,
                            bq);
          cpu::tile_gemm(dq.data() + i0 * hn, hn, dp.data(), kTile, kr.data(), hn, bq, hn, kTile);
        }
      }
      for (int64_t i = 0; i < l.s; ++i) {
        T* dst = dqkv + l.q_off(i, bb, h);
        for (int64_t c = 0; c < hn; ++c) dst[c] = scale * dq[i * hn + c];
        if (!grouped) {
          std::copy(dk + i * hn, dk + (i + 1) * hn, dqkv + l.k_off(i, bb, g));
          std::copy(dv + i * hn, dv + (i + 1) * hn, dqkv + l.v_off(i, bb, g));
        }
      }
    }
  }
  if (!grouped) return;

    // dK and dV of each group: its heads' contributions in head order.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t g = 0; g < l.ng; ++g) {
      for (int64_t j = 0; j < l.s; ++j) {
        T* dk = dqkv + l.k_off(j, bb, g);
        T* dv = dqkv + l.v_off(j, bb, g);
        std::fill(dk, dk + hn, T(0));
        std::fill(dv, dv + hn, T(0));
        for (int64_t jq = 0; jq < l.qpg; ++jq) {
          const size_t at = (bb * l.np + g * l.qpg + jq) * head_block + j * hn;
          for (int64_t c = 0; c < hn; ++c) {
            dk[c] += dk_part[at + c];
            dv[c] += dv_part[at + c];
          }
        }
      }
    }
  }
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionSpec& spec) {
  const OpTimer op_timer(OpCategory::kAttention);
  Layout l = make_layout(qkv, spec);
  check_shape(out, {l.s, l.b, l.np, l.hn}, "attention_forward out");
  check_shape(lse, {l.b, l.np, l.s}, "attention_forward lse");
  cpu::dispatch_float(qkv, "attention_forward", [&]<typename T>() {
    forward_kernel<T>(out.data<T>(), lse.data<T>(), qkv.data<T>(), l, spec);
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec) {
  const OpTimer op_timer(OpCategory::kAttention);
  Layout l = make_layout(qkv, spec);
  check_shape(dqkv, qkv.shape(), "attention_backward dqkv");
  check_shape(dout, {l.s, l.b, l.np, l.hn}, "attention_backward dout");
  check_shape(out, {l.s, l.b, l.np, l.hn}, "attention_backward out");
  check_shape(lse, {l.b, l.np, l.s}, "attention_backward lse");
  cpu::dispatch_float(qkv, "attention_backward", [&]<typename T>() {
    backward_kernel<T>(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), out.data<T>(), lse.data<T>(),
                       l, spec);
  });
}

}  // namespace megatron::ops
