// The fp64 reference ops: the formulas as printed, single-threaded, no tiling.
#include "tensor/reference/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/philox.h"

namespace megatron::ref {
namespace {
int64_t rows(const Tensor& t) {
  return t.numel() / t.dim(-1);
}
const double* P(const Tensor& t) {
  return t.data<double>();
}
double* W(Tensor& t) {
  return t.data<double>();
}
Tensor like(const Tensor& t) {
  return Tensor::zeros(t.shape(), DType::kF64);
}
int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::kI64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
}
}  // namespace

Tensor matmul(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  int64_t ar = rows(a), ac = a.dim(-1), br = rows(b), bc = b.dim(-1);
  int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  Tensor c = Tensor::zeros({m, n}, DType::kF64);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s +=
            (ta ? P(a)[p * ac + i] : P(a)[i * ac + p]) * (tb ? P(b)[j * bc + p] : P(b)[p * bc + j]);
      W(c)[i * n + j] = s;
    }
  return c;
}

Tensor gelu(const Tensor& x, bool tanh_approx) {
  Tensor y = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v = P(x)[i];
    W(y)
    [i] = tanh_approx ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                      : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  return y;
}

Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approx) {
  Tensor dx = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v = P(x)[i], d;
    if (tanh_approx) {
      double u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
      double du = std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
      double t = std::tanh(u);
      d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du;
    } else {
      d = 0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
          v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    }
    W(dx)[i] = P(dout)[i] * d;
  }
  return dx;
}

Tensor tanh(const Tensor& x) {
  Tensor y = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) W(y)[i] = std::tanh(P(x)[i]);
  return y;
}

Tensor tanh_backward(const Tensor& dout, const Tensor& y) {
  Tensor dx = like(y);
  for (int64_t i = 0; i < y.numel(); ++i) W(dx)[i] = P(dout)[i] * (1 - P(y)[i] * P(y)[i]);
  return dx;
}

Tensor squared_relu(const Tensor& x) {
  Tensor y = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) W(y)[i] = std::pow(std::max(P(x)[i], 0.0), 2);
  return y;
}

Tensor squared_relu_backward(const Tensor& dout, const Tensor& x) {
  Tensor dx = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) W(dx)[i] = P(dout)[i] * 2 * std::max(P(x)[i], 0.0);
  return dx;
}

Tensor quick_gelu(const Tensor& x) {
  Tensor y = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = P(x)[i];
    W(y)[i] = v / (1 + std::exp(-1.702 * v));
  }
  return y;
}

Tensor quick_gelu_backward(const Tensor& dout, const Tensor& x) {
  Tensor dx = like(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = P(x)[i], s = 1 / (1 + std::exp(-1.702 * v));
    W(dx)[i] = P(dout)[i] * (s + 1.702 * v * s * (1 - s));
  }
  return dx;
}

Tensor swiglu(const Tensor& x) {
  int64_t f = x.dim(-1) / 2, n = rows(x);
  Tensor y = Tensor::zeros({n, f}, DType::kF64);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      double a = P(x)[r * 2 * f + j], u = P(x)[r * 2 * f + f + j];
      W(y)[r * f + j] = a / (1 + std::exp(-a)) * u;
    }
  return y;
}

Tensor swiglu_backward(const Tensor& dout, const Tensor& x) {
  int64_t f = x.dim(-1) / 2, n = rows(x);
  Tensor dx = like(x);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      double a = P(x)[r * 2 * f + j], u = P(x)[r * 2 * f + f + j], g = P(dout)[r * f + j];
      double sig = 1 / (1 + std::exp(-a));
      W(dx)[r * 2 * f + j] = g * u * (sig + a * sig * (1 - sig));
      W(dx)[r * 2 * f + f + j] = g * a * sig;
    }
  return dx;
}

namespace {
// Megatron's glu() with clamp: x_glu.clamp(max=c), x_linear.clamp(-c, c) (clamp > 0).
double clamped(double v, double lo, double hi) {
  return v < lo ? lo : v > hi ? hi : v;
}
}  // namespace

Tensor quick_geglu(const Tensor& x, double offset, double clamp) {
  const int64_t f = x.dim(-1) / 2, n = rows(x);
  const double inf = std::numeric_limits<double>::infinity();
  const double lim = clamp > 0 ? clamp : inf;
  Tensor y = Tensor::zeros({n, f}, DType::kF64);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double a = clamped(P(x)[r * 2 * f + j], -inf, lim);
      const double u = clamped(P(x)[r * 2 * f + f + j], -lim, lim);
      W(y)[r * f + j] = a / (1 + std::exp(-1.702 * a)) * (u + offset);
    }
  return y;
}

Tensor quick_geglu_backward(const Tensor& dout, const Tensor& x, double offset, double clamp) {
  const int64_t f = x.dim(-1) / 2, n = rows(x);
  const double inf = std::numeric_limits<double>::infinity();
  const double lim = clamp > 0 ? clamp : inf;
  Tensor dx = like(x);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double a0 = P(x)[r * 2 * f + j], u0 = P(x)[r * 2 * f + f + j];
      const double a = clamped(a0, -inf, lim), u = clamped(u0, -lim, lim);
      const double g = P(dout)[r * f + j], s = 1 / (1 + std::exp(-1.702 * a));
      // d/da of a sigmoid(1.702 a), times the clamp's pass-through (inside, bounds included).
      W(dx)[r * 2 * f + j] = a0 <= lim ? g * (u + offset) * (s + 1.702 * a * s * (1 - s)) : 0;
      W(dx)[r * 2 * f + f + j] = u0 >= -lim && u0 <= lim ? g * a * s : 0;
    }
  return dx;
}

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  int64_t h = x.dim(-1);
  Tensor y = like(x);
  for (int64_t r = 0; r < rows(x); ++r) {
    const double* xr = P(x) + r * h;
    double m = 0, v = 0;
    for (int64_t j = 0; j < h; ++j) m += xr[j] / h;
    for (int64_t j = 0; j < h; ++j) v += (xr[j] - m) * (xr[j] - m) / h;
    for (int64_t j = 0; j < h; ++j)
      W(y)[r * h + j] = (xr[j] - m) / std::sqrt(v + eps) * P(w)[j] + P(b)[j];
  }
  return y;
}

NormGrads layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, double eps) {
  int64_t h = x.dim(-1);
  NormGrads g{like(x), Tensor::zeros({h}, DType::kF64), Tensor::zeros({h}, DType::kF64)};
  for (int64_t r = 0; r < rows(x); ++r) {
    const double *xr = P(x) + r * h, *gr = P(dout) + r * h;
    double m = 0, v = 0;
    for (int64_t j = 0; j < h; ++j) m += xr[j] / h;
    for (int64_t j = 0; j < h; ++j) v += (xr[j] - m) * (xr[j] - m) / h;
    double rs = 1 / std::sqrt(v + eps);
    std::vector<double> xhat(h), dxhat(h);
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (xr[j] - m) * rs;
      dxhat[j] = gr[j] * P(w)[j];
      mean_dxhat += dxhat[j] / h;
      mean_dxhat_xhat += dxhat[j] * xhat[j] / h;
      W(g.dweight)[j] += gr[j] * xhat[j];
      W(g.dbias)[j] += gr[j];
    }
    for (int64_t j = 0; j < h; ++j)
      W(g.dx)[r * h + j] = rs * (dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat);
  }
  return g;
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  int64_t h = x.dim(-1);
  Tensor y = like(x);
  for (int64_t r = 0; r < rows(x); ++r) {
    const double* xr = P(x) + r * h;
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += xr[j] * xr[j] / h;
    for (int64_t j = 0; j < h; ++j) W(y)[r * h + j] = xr[j] / std::sqrt(ms + eps) * P(w)[j];
  }
  return y;
}

NormGrads rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, double eps) {
  int64_t h = x.dim(-1);
  NormGrads g{like(x), Tensor::zeros({h}, DType::kF64), Tensor()};
  for (int64_t r = 0; r < rows(x); ++r) {
    const double *xr = P(x) + r * h, *gr = P(dout) + r * h;
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += xr[j] * xr[j] / h;
    double rs = 1 / std::sqrt(ms + eps), dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      dot += gr[j] * P(w)[j] * xr[j] * rs / h;
      W(g.dweight)[j] += gr[j] * xr[j] * rs;
    }
    for (int64_t j = 0; j < h; ++j) W(g.dx)[r * h + j] = rs * (gr[j] * P(w)[j] - xr[j] * rs * dot);
  }
  return g;
}

Tensor embedding(const Tensor& ids, const Tensor& table) {
  int64_t h = table.dim(1);
  Tensor y = Tensor::zeros({ids.numel(), h}, DType::kF64);
  for (int64_t i = 0; i < ids.numel(); ++i)
    for (int64_t j = 0; j < h; ++j) W(y)[i * h + j] = P(table)[id_at(ids, i) * h + j];
  return y;
}

Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab) {
  int64_t h = dout.dim(-1);
  Tensor d = Tensor::zeros({vocab, h}, DType::kF64);
  for (int64_t i = 0; i < ids.numel(); ++i)
    for (int64_t j = 0; j < h; ++j) W(d)[id_at(ids, i) * h + j] += P(dout)[i * h + j];
  return d;
}

namespace {
// Megatron's RotaryEmbedding.inv_freq for pair j, with _apply_scaling's Llama 3.1 rule written
// out case by case (factor f, low/high frequency factors 1 and 4, original context 8192).
double rope_inv_freq(const ops::RopeSpec& spec, int64_t j) {
  const double base_freq =
      1.0 / std::pow(static_cast<double>(spec.base), static_cast<double>(2 * j) / spec.rot_dim);
  if (spec.yarn_factor > 0) {
    // YaRN, as HF DeepSeek's yarn_find_correction_dim / yarn_find_correction_range /
    // yarn_linear_ramp_mask write it: the pair indices whose wavelengths make beta_fast and
    // beta_slow turns in the original context bound a linear ramp from the original frequency
    // to the interpolated one (base frequency / factor).
    const auto correction_dim = [&](double turns) {
      return spec.rot_dim * std::log(spec.yarn_original_max_positions / (turns * 2 * M_PI)) /
             (2 * std::log(static_cast<double>(spec.base)));
    };
    double low = correction_dim(spec.yarn_beta_fast);
    double high = correction_dim(spec.yarn_beta_slow);
    if (spec.yarn_round_to_int) {  // HF's truncate (Megatron's correction_range_round_to_int)
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = low < 0 ? 0 : low;
    high = high > spec.rot_dim - 1 ? spec.rot_dim - 1 : high;
    if (low == high) high += 0.001;
    double ramp = (static_cast<double>(j) - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    const double extrapolation_mask = 1 - ramp;
    return base_freq / spec.yarn_factor * (1 - extrapolation_mask) + base_freq * extrapolation_mask;
  }
  if (spec.scaling_factor <= 0) return base_freq;
  const double wavelen = 2 * M_PI / base_freq, low_wavelen = 8192.0, high_wavelen = 2048.0;
  if (wavelen < high_wavelen) return base_freq;                       // high frequency: kept
  if (wavelen > low_wavelen) return base_freq / spec.scaling_factor;  // low: slowed
  const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
  return (1 - smooth) * base_freq / spec.scaling_factor + smooth * base_freq;
}
}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const ops::RopeSpec& spec, bool inverse) {
  int64_t s = x.dim(0), b = x.dim(1), G = x.dim(2), Pp = x.dim(3), hn = x.dim(4);
  int64_t half = spec.rot_dim / 2;
  Tensor y = x.clone();
  for (int64_t t = 0; t < s; ++t)
    for (int64_t bb = 0; bb < b; ++bb) {
      double pos = positions.defined() ? positions.data<int64_t>()[t * b + bb] : t;
      pos *= spec.position_scale;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t p = spec.head_begin; p < spec.head_end; ++p) {
          double* v = W(y) + (((t * b + bb) * G + g) * Pp + p) * hn;
          for (int64_t j = 0; j < half; ++j) {
            double theta = pos * rope_inv_freq(spec, j);
            if (inverse) theta = -theta;
            // The pair: (j, j + half), or (2j, 2j + 1) with interleaving.
            const int64_t i1 = spec.interleaved ? 2 * j : j;
            const int64_t i2 = spec.interleaved ? 2 * j + 1 : j + half;
            double x1 = v[i1], x2 = v[i2];
            const double c = spec.mscale * std::cos(theta), sn = spec.mscale * std::sin(theta);
            v[i1] = x1 * c - x2 * sn;
            v[i2] = x2 * c + x1 * sn;
          }
        }
    }
  return y;
}

namespace {
// Attention for one (batch, head), explicitly: the masked scaled scores plus bias, the
// probabilities (after softmax, before dropout), the dropout keep-scales and the row lse.
struct HeadAttention {
  int64_t sq, skv;
  std::vector<double> pm, keep, lse;
  std::vector<char> visible;
  double max_score = -std::numeric_limits<double>::infinity();  // over every visible pair
};

struct AttnDims {
  int64_t sq, skv, b, np, ng, hn;
  int64_t qpg() const { return np / ng; }
  const double* q(const Tensor& t, int64_t i, int64_t bb, int64_t h) const {
    return P(t) + ((i * b + bb) * np + h) * hn;
  }
  const double* kv(const Tensor& t, int64_t j, int64_t bb, int64_t h) const {
    return P(t) + ((j * b + bb) * ng + h / qpg()) * hn;
  }
};

AttnDims attn_dims(const Tensor& q, const Tensor& k) {
  return AttnDims{q.dim(0), k.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

bool visible(const ops::AttentionSpec& spec, const AttnDims& d, int64_t bb, int64_t i, int64_t j) {
  const int64_t ig = spec.q_offset + i, jg = spec.kv_offset + j;
  if (spec.causal && jg > ig) return false;
  if (spec.doc_start.defined() && jg < spec.doc_start.data<int32_t>()[bb * d.sq + i]) return false;
  if (spec.window >= 0 && jg < ig - spec.window) return false;
  if (spec.key_valid.defined() && spec.key_valid.data<int32_t>()[bb * d.skv + j] == 0) return false;
  return true;
}

HeadAttention head_attention(const Tensor& q, const Tensor& k, const ops::AttentionSpec& spec,
                             const AttnDims& d, int64_t bb, int64_t h) {
  HeadAttention a{d.sq,
                  d.skv,
                  std::vector<double>(d.sq * d.skv, 0.0),
                  std::vector<double>(d.sq * d.skv, 1.0),
                  std::vector<double>(d.sq),
                  std::vector<char>(d.sq * d.skv, 0)};
  const int64_t heads = spec.total_heads > 0 ? spec.total_heads : d.np;
  const int64_t qpos = spec.q_positions > 0 ? spec.q_positions : d.sq;
  const int64_t kvpos = spec.kv_positions > 0 ? spec.kv_positions : d.skv;
  for (int64_t i = 0; i < d.sq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    std::vector<double> sc(d.skv, -std::numeric_limits<double>::infinity());
    for (int64_t j = 0; j < d.skv; ++j) {
      if (!visible(spec, d, bb, i, j)) continue;
      a.visible[i * d.skv + j] = 1;
      double dot = 0;
      for (int64_t c = 0; c < d.hn; ++c) dot += d.q(q, i, bb, h)[c] * d.kv(k, j, bb, h)[c];
      sc[j] = dot * spec.scale;
      if (spec.bias.defined()) {
        const int64_t bsel = spec.bias.dim(0) == 1 ? 0 : bb;
        sc[j] += P(spec.bias)[((bsel * d.np + h) * d.sq + i) * d.skv + j];
      }
      mx = std::max(mx, sc[j]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) {  // no visible key: out 0, lse -inf
      a.lse[i] = mx;
      continue;
    }
    a.max_score = std::max(a.max_score, mx);
    double z = 0;
    for (int64_t j = 0; j < d.skv; ++j) z += a.visible[i * d.skv + j] ? std::exp(sc[j] - mx) : 0;
    a.lse[i] = mx + std::log(z);
    for (int64_t j = 0; j < d.skv; ++j) {
      if (!a.visible[i * d.skv + j]) continue;
      a.pm[i * d.skv + j] = std::exp(sc[j] - mx) / z;
      if (spec.dropout > 0) {
        const uint64_t idx = static_cast<uint64_t>(
            ((bb * heads + spec.head_offset + h) * qpos + spec.q_offset + i) * kvpos +
            spec.kv_offset + j);
        a.keep[i * d.skv + j] = Philox::uniform(spec.seed, spec.stream, idx) >= spec.dropout
                                    ? 1.0 / (1.0 - spec.dropout)
                                    : 0.0;
      }
    }
  }
  return a;
}
}  // namespace

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const ops::AttentionSpec& spec) {
  const AttnDims d = attn_dims(q, k);
  AttentionResult r{Tensor::zeros({d.sq, d.b, d.np, d.hn}, DType::kF64),
                    Tensor::zeros({d.b, d.np, d.sq}, DType::kF64),
                    Tensor::full({d.np}, -std::numeric_limits<double>::infinity(), DType::kF64)};
  for (int64_t bb = 0; bb < d.b; ++bb)
    for (int64_t h = 0; h < d.np; ++h) {
      const HeadAttention a = head_attention(q, k, spec, d, bb, h);
      W(r.max_score)[h] = std::max(W(r.max_score)[h], a.max_score);
      for (int64_t i = 0; i < d.sq; ++i) {
        W(r.lse)[(bb * d.np + h) * d.sq + i] = a.lse[i];
        double* o = W(r.out) + ((i * d.b + bb) * d.np + h) * d.hn;
        for (int64_t j = 0; j < d.skv; ++j)
          for (int64_t c = 0; c < d.hn; ++c)
            o[c] += a.pm[i * d.skv + j] * a.keep[i * d.skv + j] * d.kv(v, j, bb, h)[c];
      }
    }
  return r;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const ops::AttentionSpec& spec,
                                  const Tensor& out, const Tensor& lse) {
  const AttnDims d = attn_dims(q, k);
  AttentionGrads g{like(q), like(k), like(v), spec.bias.defined() ? like(spec.bias) : Tensor()};
  for (int64_t bb = 0; bb < d.b; ++bb)
    for (int64_t h = 0; h < d.np; ++h) {
      HeadAttention a = head_attention(q, k, spec, d, bb, h);
      for (int64_t i = 0; i < d.sq; ++i) {
        const double* go = P(dout) + ((i * d.b + bb) * d.np + h) * d.hn;
        if (lse.defined()) {
          // P over the block, renormalised from its own lse to the given one.
          const double lg = P(lse)[(bb * d.np + h) * d.sq + i];
          const double f =
              a.lse[i] == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(a.lse[i] - lg);
          for (int64_t j = 0; j < d.skv; ++j) a.pm[i * d.skv + j] *= f;
        }
        // dP_ij = keep_ij dO_i . v_j; dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)
        std::vector<double> dp(d.skv, 0.0);
        double rowsum = 0;
        for (int64_t j = 0; j < d.skv; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d.hn; ++c) dot += go[c] * d.kv(v, j, bb, h)[c];
          dp[j] = a.keep[i * d.skv + j] * dot;
          rowsum += a.pm[i * d.skv + j] * dp[j];
        }
        if (out.defined()) {  // sum over every block's keys: dout . out
          rowsum = 0;
          const double* o = P(out) + ((i * d.b + bb) * d.np + h) * d.hn;
          for (int64_t c = 0; c < d.hn; ++c) rowsum += go[c] * o[c];
        }
        for (int64_t j = 0; j < d.skv; ++j) {
          const double ds = a.pm[i * d.skv + j] * (dp[j] - rowsum);
          if (spec.bias.defined()) {
            const int64_t bsel = spec.bias.dim(0) == 1 ? 0 : bb;
            W(g.dbias)[((bsel * d.np + h) * d.sq + i) * d.skv + j] += ds;
          }
          double* dq = W(g.dq) + ((i * d.b + bb) * d.np + h) * d.hn;
          double* dk = W(g.dk) + ((j * d.b + bb) * d.ng + h / d.qpg()) * d.hn;
          double* dv = W(g.dv) + ((j * d.b + bb) * d.ng + h / d.qpg()) * d.hn;
          for (int64_t c = 0; c < d.hn; ++c) {
            dq[c] += ds * spec.scale * d.kv(k, j, bb, h)[c];
            dk[c] += ds * spec.scale * d.q(q, i, bb, h)[c];
            dv[c] += a.pm[i * d.skv + j] * a.keep[i * d.skv + j] * go[c];
          }
        }
      }
    }
  return g;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_size) {
  int64_t n = rows(logits), vp = logits.dim(-1);
  Tensor loss = Tensor::zeros({n}, DType::kF64);
  for (int64_t r = 0; r < n; ++r) {
    const double* row = P(logits) + r * vp;
    double mx = -std::numeric_limits<double>::infinity(), z = 0;
    for (int64_t j = 0; j < vocab_size; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < vocab_size; ++j) z += std::exp(row[j] - mx);
    W(loss)[r] = mx + std::log(z) - row[targets.data<int64_t>()[r]];
  }
  return loss;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              int64_t vocab_size) {
  int64_t n = rows(logits), vp = logits.dim(-1);
  Tensor d = like(logits);
  for (int64_t r = 0; r < n; ++r) {
    const double* row = P(logits) + r * vp;
    double mx = -std::numeric_limits<double>::infinity(), z = 0;
    for (int64_t j = 0; j < vocab_size; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < vocab_size; ++j) z += std::exp(row[j] - mx);
    for (int64_t j = 0; j < vocab_size; ++j) W(d)
    [r * vp + j] =
        P(dloss)[r] * (std::exp(row[j] - mx) / z - (j == targets.data<int64_t>()[r] ? 1.0 : 0.0));
  }
  return d;
}

AdamState adamw(const AdamState& s, const Tensor& grad, const ops::AdamWSpec& spec) {
  AdamState o{s.param.clone(), s.exp_avg.clone(), s.exp_avg_sq.clone()};
  double bc1 = 1 - std::pow(static_cast<double>(spec.beta1), spec.step);
  double bc2 = 1 - std::pow(static_cast<double>(spec.beta2), spec.step);
  for (int64_t i = 0; i < grad.numel(); ++i) {
    double g = P(grad)[i] * spec.grad_scale;
    double m = spec.beta1 * P(s.exp_avg)[i] + (1 - spec.beta1) * g;
    double v = spec.beta2 * P(s.exp_avg_sq)[i] + (1 - spec.beta2) * g * g;
    W(o.exp_avg)[i] = m;
    W(o.exp_avg_sq)[i] = v;
    W(o.param)
    [i] -=
        spec.lr * ((m / bc1) / (std::sqrt(v / bc2) + spec.eps) + spec.weight_decay * P(s.param)[i]);
  }
  return o;
}

}  // namespace megatron::ref
