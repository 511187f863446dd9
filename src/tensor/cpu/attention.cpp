// Tiled scaled-dot-product attention with an online softmax (FlashAttention-2 style) on CPU.
//
// Forward walks key tiles for a block of query rows, keeping a running max and sum per row, so no
// s x s score matrix ever exists; it keeps only out and the per-row log-sum-exp. Backward
// recomputes probabilities from lse: P_ij = exp(scale q_i.k_j - lse_i), and with
// D_i = dO_i . O_i (equal to sum_j P_ij dP_ij, dropout included):
//   dV_j += Pd_ij dO_i,  dP_ij = mask_ij/(1-p) dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
//   dQ_i += scale dS_ij k_j,  dK_j += scale dS_ij q_i.
// Backward runs in two race-free passes: dK/dV parallel over (batch, query group, key tile), then
// dQ parallel over (batch, head, query tile). Each pass recomputes scores, which keeps results
// deterministic without atomics or per-thread copies.
#include <cmath>
#include <limits>
#include <vector>

#include "core/philox.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron::ops {
namespace {

constexpr int64_t kTile = 64;

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

template <typename T>
void forward_kernel(T* out, T* lse, const T* qkv, const Layout& l, const AttentionSpec& spec) {
  const int64_t ntiles = (l.s + kTile - 1) / kTile;
  const T scale = static_cast<T>(spec.scale);
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t h = 0; h < l.np; ++h) {
      for (int64_t qt = 0; qt < ntiles; ++qt) {
        const int64_t g = h / l.qpg;
        std::vector<T> acc(static_cast<size_t>(l.hn)), sc(kTile);
        for (int64_t i = qt * kTile; i < std::min(l.s, (qt + 1) * kTile); ++i) {
          const T* q = qkv + l.q_off(i, bb, h);
          T m = -std::numeric_limits<T>::infinity(), sum = 0;
          std::fill(acc.begin(), acc.end(), T(0));
          const int64_t jend = spec.causal ? i + 1 : l.s;
          for (int64_t j0 = first_key(spec, l, bb, i); j0 < jend; j0 += kTile) {
            const int64_t j1 = std::min(jend, j0 + kTile);
            T tile_max = -std::numeric_limits<T>::infinity();
            for (int64_t j = j0; j < j1; ++j) {
              sc[j - j0] = scale * dot(q, qkv + l.k_off(j, bb, g), l.hn);
              tile_max = std::max(tile_max, sc[j - j0]);
            }
            const T m_new = std::max(m, tile_max);
            const T alpha = cpu::vexp(m - m_new);
            sum *= alpha;
            for (int64_t k = 0; k < l.hn; ++k) acc[k] *= alpha;
            for (int64_t j = j0; j < j1; ++j) {
              T p = cpu::vexp(sc[j - j0] - m_new);
              sum += p;
              if (spec.dropout > 0) p *= dropout_scale(spec, l, bb, h, i, j);
              const T* v = qkv + l.v_off(j, bb, g);
#pragma omp simd
              for (int64_t k = 0; k < l.hn; ++k) acc[k] += p * v[k];
            }
            m = m_new;
          }
          T* o = out + l.o_off(i, bb, h);
          const T inv = 1 / sum;
          for (int64_t k = 0; k < l.hn; ++k) o[k] = acc[k] * inv;
          lse[l.lse_off(i, bb, h)] = m + std::log(sum);
        }
      }
    }
  }
}

template <typename T>
void backward_kernel(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                     const Layout& l, const AttentionSpec& spec) {
  const int64_t ntiles = (l.s + kTile - 1) / kTile;
  const T scale = static_cast<T>(spec.scale);
  const bool drop = spec.dropout > 0;
  // D_i = dO_i . O_i for every (b, head, row).
  std::vector<T> D(static_cast<size_t>(l.b * l.np * l.s));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < l.b; ++bb)
    for (int64_t h = 0; h < l.np; ++h)
      for (int64_t i = 0; i < l.s; ++i)
        D[l.lse_off(i, bb, h)] = dot(dout + l.o_off(i, bb, h), out + l.o_off(i, bb, h), l.hn);

  // dqkv is written, not accumulated: clear it (q, k and v slots are all overwritten below, but
  // accumulation into dk/dv needs a zero start).
  std::fill(dqkv, dqkv + l.s * l.b * l.token_stride(), T(0));

  // Pass 1: dK, dV for each key tile of each (batch, group).
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t g = 0; g < l.ng; ++g) {
      for (int64_t kt = 0; kt < ntiles; ++kt) {
        const int64_t j0 = kt * kTile, j1 = std::min(l.s, j0 + kTile);
        for (int64_t jq = 0; jq < l.qpg; ++jq) {
          const int64_t h = g * l.qpg + jq;
          const int64_t i0 = spec.causal ? j0 : 0;
          for (int64_t i = i0; i < l.s; ++i) {
            const T* q = qkv + l.q_off(i, bb, h);
            const T* go = dout + l.o_off(i, bb, h);
            const T li = lse[l.lse_off(i, bb, h)], Di = D[l.lse_off(i, bb, h)];
            const int64_t jend = spec.causal ? std::min(j1, i + 1) : j1;
            for (int64_t j = std::max(j0, first_key(spec, l, bb, i)); j < jend; ++j) {
              const T* k = qkv + l.k_off(j, bb, g);
              const T* v = qkv + l.v_off(j, bb, g);
              const T p = cpu::vexp(scale * dot(q, k, l.hn) - li);
              const T keep = drop ? static_cast<T>(dropout_scale(spec, l, bb, h, i, j)) : T(1);
              const T dp = keep * dot(go, v, l.hn);
              const T ds = p * (dp - Di) * scale;
              const T pd = p * keep;
              T* dk = dqkv + l.k_off(j, bb, g);
              T* dv = dqkv + l.v_off(j, bb, g);
#pragma omp simd
              for (int64_t c = 0; c < l.hn; ++c) {
                dv[c] += pd * go[c];
                dk[c] += ds * q[c];
              }
            }
          }
        }
      }
    }
  }

  // Pass 2: dQ for each query tile of each (batch, head).
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int64_t bb = 0; bb < l.b; ++bb) {
    for (int64_t h = 0; h < l.np; ++h) {
      for (int64_t qt = 0; qt < ntiles; ++qt) {
        const int64_t g = h / l.qpg;
        for (int64_t i = qt * kTile; i < std::min(l.s, (qt + 1) * kTile); ++i) {
          const T* q = qkv + l.q_off(i, bb, h);
          const T* go = dout + l.o_off(i, bb, h);
          const T li = lse[l.lse_off(i, bb, h)], Di = D[l.lse_off(i, bb, h)];
          T* dq = dqkv + l.q_off(i, bb, h);
          const int64_t jend = spec.causal ? i + 1 : l.s;
          for (int64_t j = first_key(spec, l, bb, i); j < jend; ++j) {
            const T* k = qkv + l.k_off(j, bb, g);
            const T* v = qkv + l.v_off(j, bb, g);
            const T p = cpu::vexp(scale * dot(q, k, l.hn) - li);
            const T keep = drop ? static_cast<T>(dropout_scale(spec, l, bb, h, i, j)) : T(1);
            const T ds = p * (keep * dot(go, v, l.hn) - Di) * scale;
#pragma omp simd
            for (int64_t c = 0; c < l.hn; ++c) dq[c] += ds * k[c];
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
