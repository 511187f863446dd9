// The reference device's ops: each checks that its floating tensors are f64 and computes the
// formula of ops.h directly, or through the fp64 formulas of reference.h, into the op's output
// arguments with the op's write / accumulate convention. Clarity over speed throughout.
#include "tensor/reference/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/philox.h"
#include "tensor/reference/reference.h"

namespace megatron::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Floating tensors on this device are f64 (undefined ones are optional arguments).
void f64(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    MEGATRON_CHECK(!t->defined() || t->dtype() == DType::kF64, op,
                   ": the reference device computes in f64, got ", t->str());
  }
}
const double* P(const Tensor& t) {
  return t.data<double>();
}
double* W(const Tensor& t) {
  return t.data<double>();
}
int64_t rows(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}
int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::kI64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
}
void write(Tensor& out, const Tensor& value, const char* op) {
  MEGATRON_CHECK(out.numel() == value.numel(), op, ": output ", out.str(), " should hold ",
                 value.str());
  out.copy_from(value);
}
void accumulate(Tensor& out, const Tensor& value) {
  for (int64_t i = 0; i < out.numel(); ++i) W(out)[i] += P(value)[i];
}
// Element (t, bb, g, p, c) of a view, as the [s, b, heads, hn] tensor it stands for.
int64_t view_index(const AttentionView& v, int64_t t, int64_t bb, int64_t g, int64_t p) {
  return v.offset + t * v.stride_s + bb * v.stride_b + g * v.stride_g + p * v.stride_p;
}
Tensor gather_view(const AttentionView& v) {
  Tensor out = Tensor::empty({v.s, v.b, v.heads(), v.hn}, DType::kF64);
  for (int64_t t = 0; t < v.s; ++t)
    for (int64_t bb = 0; bb < v.b; ++bb)
      for (int64_t g = 0; g < v.groups; ++g)
        for (int64_t p = 0; p < v.per_group; ++p)
          for (int64_t c = 0; c < v.hn; ++c) W(out)
  [((t * v.b + bb) * v.heads() + g * v.per_group + p) * v.hn + c] =
      P(v.tensor)[view_index(v, t, bb, g, p) + c];
  return out;
}
void scatter_view(const AttentionView& v, const Tensor& x) {
  for (int64_t t = 0; t < v.s; ++t)
    for (int64_t bb = 0; bb < v.b; ++bb)
      for (int64_t g = 0; g < v.groups; ++g)
        for (int64_t p = 0; p < v.per_group; ++p)
          for (int64_t c = 0; c < v.hn; ++c) W(v.tensor)
  [view_index(v, t, bb, g, p) + c] =
      P(x)[((t * v.b + bb) * v.heads() + g * v.per_group + p) * v.hn + c];
}
bool keep(float p, uint64_t seed, uint64_t stream, uint64_t counter) {
  return Philox::uniform(seed, stream, counter) >= p;
}

}  // namespace

void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta) {
  f64("matmul", {&out, &a, &b});
  const Tensor c = ref::matmul(a, trans_a, b, trans_b);
  MEGATRON_CHECK(out.numel() == c.numel(), "matmul: out ", out.str(), " is not ", c.str());
  if (beta == 0.0f) {
    out.copy_from(c);
  } else {
    accumulate(out, c);
  }
}

// Group by group, each a plain matmul of its rows: the definition in ops.h.
void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta) {
  f64("grouped_matmul", {&out, &a});
  MEGATRON_CHECK(b.size() == sizes.size(), "grouped_matmul: ", b.size(), " matrices for ",
                 sizes.size(), " groups");
  const Tensor a2 = a.view({rows(a), a.dim(-1)});
  Tensor o2 = out.view({rows(out), out.dim(-1)});
  int64_t at = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    f64("grouped_matmul", {&b[g]});
    Tensor o = o2.slice0(at, at + sizes[g]);
    matmul(o, a2.slice0(at, at + sizes[g]), false, b[g], trans_b, beta);
    at += sizes[g];
  }
  MEGATRON_CHECK(at == rows(a), "grouped_matmul: group sizes sum to ", at, ", a has ", rows(a),
                 " rows");
}

void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta) {
  f64("grouped_matmul_at", {&a, &c});
  MEGATRON_CHECK(out.size() == sizes.size(), "grouped_matmul_at: ", out.size(), " outputs for ",
                 sizes.size(), " groups");
  const Tensor a2 = a.view({rows(a), a.dim(-1)}), c2 = c.view({rows(c), c.dim(-1)});
  int64_t at = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    f64("grouped_matmul_at", {&out[g]});
    matmul(out[g], a2.slice0(at, at + sizes[g]), true, c2.slice0(at, at + sizes[g]), false, beta);
    at += sizes[g];
  }
  MEGATRON_CHECK(at == rows(a) && at == rows(c), "grouped_matmul_at: group sizes sum to ", at,
                 ", a has ", rows(a), " rows, c ", rows(c));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  f64("add", {&out, &a, &b});
  for (int64_t i = 0; i < out.numel(); ++i) W(out)[i] = P(a)[i] + P(b)[i];
}

void add_inplace(Tensor& out, const Tensor& a) {
  f64("add_inplace", {&out, &a});
  accumulate(out, a);
}

void mul(Tensor& out, const Tensor& a, const Tensor& b) {
  f64("mul", {&out, &a, &b});
  for (int64_t i = 0; i < out.numel(); ++i) W(out)[i] = P(a)[i] * P(b)[i];
}

void scale_rows(Tensor& x, const Tensor& scale) {
  f64("scale_rows", {&x, &scale});
  const int64_t c = x.numel() / scale.numel();
  for (int64_t i = 0; i < x.numel(); ++i) W(x)[i] *= P(scale)[i / c];
}

void row_dots(Tensor& out, const Tensor& a, const Tensor& b) {
  f64("row_dots", {&out, &a, &b});
  const int64_t c = a.numel() / out.numel();
  for (int64_t r = 0; r < out.numel(); ++r) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += P(a)[r * c + j] * P(b)[r * c + j];
    W(out)[r] = s;
  }
}

void bias_add(Tensor& x, const Tensor& bias) {
  f64("bias_add", {&x, &bias});
  for (int64_t i = 0; i < x.numel(); ++i) W(x)[i] += P(bias)[i % bias.numel()];
}

void bias_backward(Tensor& dbias, const Tensor& dy) {
  f64("bias_backward", {&dbias, &dy});
  for (int64_t i = 0; i < dy.numel(); ++i) W(dbias)[i % dbias.numel()] += P(dy)[i];
}

void scale_inplace(Tensor& x, double factor) {
  f64("scale_inplace", {&x});
  for (int64_t i = 0; i < x.numel(); ++i) W(x)[i] *= factor;
}

void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx) {
  f64("gelu_forward", {&out, &x});
  write(out, ref::gelu(x, tanh_approx), "gelu_forward");
}

void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  f64("gelu_backward", {&dx, &dout, &x});
  write(dx, ref::gelu_backward(dout, x, tanh_approx), "gelu_backward");
}

void tanh_forward(Tensor& out, const Tensor& x) {
  f64("tanh_forward", {&out, &x});
  write(out, ref::tanh(x), "tanh_forward");
}

void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y) {
  f64("tanh_backward", {&dx, &dout, &y});
  write(dx, ref::tanh_backward(dout, y), "tanh_backward");
}

void squared_relu_forward(Tensor& out, const Tensor& x) {
  f64("squared_relu_forward", {&out, &x});
  write(out, ref::squared_relu(x), "squared_relu_forward");
}

void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  f64("squared_relu_backward", {&dx, &dout, &x});
  write(dx, ref::squared_relu_backward(dout, x), "squared_relu_backward");
}

void quick_gelu_forward(Tensor& out, const Tensor& x) {
  f64("quick_gelu_forward", {&out, &x});
  write(out, ref::quick_gelu(x), "quick_gelu_forward");
}

void quick_gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  f64("quick_gelu_backward", {&dx, &dout, &x});
  write(dx, ref::quick_gelu_backward(dout, x), "quick_gelu_backward");
}

void swiglu_forward(Tensor& out, const Tensor& x) {
  f64("swiglu_forward", {&out, &x});
  write(out, ref::swiglu(x), "swiglu_forward");
}

void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  f64("swiglu_backward", {&dx, &dout, &x});
  write(dx, ref::swiglu_backward(dout, x), "swiglu_backward");
}

void quick_geglu_forward(Tensor& out, const Tensor& x, double offset, double clamp) {
  f64("quick_geglu_forward", {&out, &x});
  write(out, ref::quick_geglu(x, offset, clamp), "quick_geglu_forward");
}

void quick_geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, double offset,
                          double clamp) {
  f64("quick_geglu_backward", {&dx, &dout, &x});
  write(dx, ref::quick_geglu_backward(dout, x, offset, clamp), "quick_geglu_backward");
}

void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset) {
  f64("dropout_forward", {&out, &x});
  const double scale = 1.0 / (1.0 - static_cast<double>(p));
  for (int64_t i = 0; i < x.numel(); ++i)
    W(out)[i] = keep(p, seed, stream, offset + static_cast<uint64_t>(i)) ? P(x)[i] * scale : 0.0;
}

void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset) {
  dropout_forward(dx, dout, p, seed, stream, offset);  // the same mask and scale
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps) {
  f64("layernorm_forward", {&out, &mean, &rstd, &x, &weight, &bias});
  const int64_t n = rows(x), h = x.dim(-1);
  for (int64_t r = 0; r < n; ++r) {
    const double* xr = P(x) + r * h;
    double mu = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mu += xr[j] / h;
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mu) * (xr[j] - mu) / h;
    W(mean)[r] = mu;
    W(rstd)[r] = 1 / std::sqrt(var + static_cast<double>(eps));
    for (int64_t j = 0; j < h; ++j)
      W(out)[r * h + j] = (xr[j] - mu) * P(rstd)[r] * P(weight)[j] + P(bias)[j];
  }
}

void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  f64("layernorm_backward", {&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd});
  const int64_t n = rows(x), h = x.dim(-1);
  for (int64_t r = 0; r < n; ++r) {
    // xhat = (x - mean) rstd, g = dout w: dx = rstd (g - mean(g) - xhat mean(g xhat)).
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double xhat = (P(x)[r * h + j] - P(mean)[r]) * P(rstd)[r];
      const double g = P(dout)[r * h + j] * P(weight)[j];
      mg += g / h;
      mgx += g * xhat / h;
      W(dweight)[j] += P(dout)[r * h + j] * xhat;
      W(dbias)[j] += P(dout)[r * h + j];
    }
    for (int64_t j = 0; j < h; ++j) {
      const double xhat = (P(x)[r * h + j] - P(mean)[r]) * P(rstd)[r];
      const double g = P(dout)[r * h + j] * P(weight)[j];
      W(dx)[r * h + j] = P(rstd)[r] * (g - mg - xhat * mgx);
    }
  }
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  f64("rmsnorm_forward", {&out, &rstd, &x, &weight});
  const int64_t n = rows(x), h = x.dim(-1);
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += P(x)[r * h + j] * P(x)[r * h + j] / h;
    W(rstd)[r] = 1 / std::sqrt(ms + static_cast<double>(eps));
    for (int64_t j = 0; j < h; ++j) W(out)[r * h + j] = P(x)[r * h + j] * P(rstd)[r] * P(weight)[j];
  }
}

void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  f64("rmsnorm_backward", {&dx, &dweight, &dout, &x, &weight, &rstd});
  const int64_t n = rows(x), h = x.dim(-1);
  for (int64_t r = 0; r < n; ++r) {
    // xhat = x rstd, g = dout w: dx = rstd (g - xhat mean(g xhat)).
    double mgx = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double xhat = P(x)[r * h + j] * P(rstd)[r];
      mgx += P(dout)[r * h + j] * P(weight)[j] * xhat / h;
      W(dweight)[j] += P(dout)[r * h + j] * xhat;
    }
    for (int64_t j = 0; j < h; ++j) {
      const double xhat = P(x)[r * h + j] * P(rstd)[r];
      W(dx)[r * h + j] = P(rstd)[r] * (P(dout)[r * h + j] * P(weight)[j] - xhat * mgx);
    }
  }
}

void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
  f64("embedding_forward", {&out, &table});
  write(out, ref::embedding(ids, table), "embedding_forward");
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  f64("embedding_backward", {&dtable, &dout});
  accumulate(dtable, ref::embedding_backward(dout, ids, dtable.dim(0)));
}

void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start) {
  f64("embedding_forward_shard", {&out, &table_shard});
  const int64_t n = ids.numel(), block = table_shard.dim(0), h = table_shard.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = id_at(ids, i) - vocab_start;
    for (int64_t j = 0; j < h; ++j)
      W(out)[i * h + j] = local >= 0 && local < block ? P(table_shard)[local * h + j] : 0.0;
  }
}

void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start) {
  f64("embedding_backward_shard", {&dtable_shard, &dout});
  const int64_t n = ids.numel(), block = dtable_shard.dim(0), h = dtable_shard.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = id_at(ids, i) - vocab_start;
    if (local < 0 || local >= block) continue;
    for (int64_t j = 0; j < h; ++j) W(dtable_shard)[local * h + j] += P(dout)[i * h + j];
  }
}

void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse) {
  f64("rope_inplace", {&x});
  x.copy_from(ref::rope(x, positions, spec, inverse));
}

void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec) {
  f64("attention_forward", {&out, &lse, &q.tensor, &k.tensor, &v.tensor, &spec.bias});
  const ref::AttentionResult r =
      ref::attention(gather_view(q), gather_view(k), gather_view(v), spec);
  write(out, r.out, "attention_forward");
  write(lse, r.lse, "attention_forward");
  if (spec.max_logit.defined()) {
    f64("attention_forward", {&spec.max_logit});
    check_shape(spec.max_logit, {r.max_score.numel()}, "attention_forward max_logit");
    for (int64_t h = 0; h < spec.max_logit.numel(); ++h)
      W(spec.max_logit)[h] = std::max(P(spec.max_logit)[h], P(r.max_score)[h]);
  }
}

void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec) {
  f64("attention_backward", {&dq.tensor, &dk.tensor, &dv.tensor, &dbias, &dout, &q.tensor,
                             &k.tensor, &v.tensor, &out, &lse, &spec.bias});
  const ref::AttentionGrads g =
      ref::attention_backward(dout, gather_view(q), gather_view(k), gather_view(v), spec, out, lse);
  scatter_view(dq, g.dq);
  scatter_view(dk, g.dk);
  scatter_view(dv, g.dv);
  if (dbias.defined()) {
    Tensor d = dbias;
    write(d, g.dbias, "attention_backward");
  }
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  f64("attention_merge", {&out, &lse, &out_b, &lse_b});
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t h = 0; h < np; ++h) {
        double* l = W(lse) + (bb * np + h) * sq + i;
        const double lb = P(lse_b)[(bb * np + h) * sq + i];
        double* o = W(out) + ((i * b + bb) * np + h) * hn;
        const double* ob = P(out_b) + ((i * b + bb) * np + h) * hn;
        const double m = std::max(*l, lb);
        if (m == kNegInf) {  // neither set had a visible key
          for (int64_t c = 0; c < hn; ++c) o[c] = 0;
          continue;
        }
        const double merged = m + std::log(std::exp(*l - m) + std::exp(lb - m));
        for (int64_t c = 0; c < hn; ++c)
          o[c] = std::exp(*l - merged) * o[c] + std::exp(lb - merged) * ob[c];
        *l = merged;
      }
}

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink) {
  f64("attention_sink_forward", {&out, &lse, &sink});
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t h = 0; h < np; ++h) {
        // The sink is one more logit of the row's softmax whose value is zero.
        double* l = W(lse) + (bb * np + h) * sq + i;
        const double s = P(sink)[h];
        const double merged = std::log(std::exp(*l) + std::exp(s));
        double* o = W(out) + ((i * b + bb) * np + h) * hn;
        for (int64_t c = 0; c < hn; ++c) o[c] *= std::exp(*l) / std::exp(merged);
        *l = merged;
      }
}

void attention_sink_backward(Tensor& dsink, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& sink) {
  f64("attention_sink_backward", {&dsink, &dout, &out, &lse, &sink});
  const int64_t sq = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  for (int64_t h = 0; h < np; ++h) {
    // d loss / d sink = sum over rows of (probability of the sink) x (0 - dout . out).
    double acc = 0;
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t bb = 0; bb < b; ++bb) {
        const double p = std::exp(P(sink)[h]) / std::exp(P(lse)[(bb * np + h) * sq + i]);
        const int64_t at = ((i * b + bb) * np + h) * hn;
        double dot = 0;
        for (int64_t c = 0; c < hn; ++c) dot += P(dout)[at + c] * P(out)[at + c];
        acc += p * (0 - dot);
      }
    W(dsink)[h] = acc;
  }
}

void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  f64("cross_entropy_forward", {&loss, &lse, &logits});
  const Tensor l = ref::cross_entropy(logits, targets, vocab_size);
  write(loss, l, "cross_entropy_forward");
  for (int64_t r = 0; r < l.numel(); ++r)  // loss = lse - target logit
    W(lse)[r] = P(l)[r] + P(logits)[r * logits.dim(-1) + targets.data<int64_t>()[r]];
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size) {
  f64("cross_entropy_backward", {&dlogits, &dloss, &logits, &lse});
  // Computed whole before writing: dlogits may alias logits.
  const Tensor d = ref::cross_entropy_backward(dloss, logits, targets, vocab_size);
  write(dlogits, d, "cross_entropy_backward");
}

void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size) {
  f64("log_softmax_gather", {&logprob, &logits});
  const Tensor l = ref::cross_entropy(logits, targets, vocab_size);
  for (int64_t r = 0; r < l.numel(); ++r) W(logprob)[r] = -P(l)[r];
}

void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid) {
  f64("cross_entropy_shard_max", {&row_max, &logits_shard});
  const int64_t block = logits_shard.dim(-1);
  for (int64_t r = 0; r < rows(logits_shard); ++r) {
    double m = kNegInf;
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, P(logits_shard)[r * block + j]);
    W(row_max)[r] = m;
  }
}

void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid) {
  f64("cross_entropy_shard_sums", {&sums, &logits_shard, &row_max});
  const int64_t n = rows(logits_shard), block = logits_shard.dim(-1);
  for (int64_t r = 0; r < n; ++r) {
    const double* row = P(logits_shard) + r * block;
    double z = 0;
    for (int64_t j = 0; j < valid; ++j) z += std::exp(row[j] - P(row_max)[r]);
    const int64_t local = targets.data<int64_t>()[r] - vocab_start;
    W(sums)[r] = z;
    W(sums)[n + r] = local >= 0 && local < valid ? row[local] : 0.0;
  }
}

void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums) {
  f64("cross_entropy_shard_finish", {&loss, &lse, &row_max, &sums});
  const int64_t n = row_max.numel();
  for (int64_t r = 0; r < n; ++r) {
    W(lse)[r] = P(row_max)[r] + std::log(P(sums)[r]);
    W(loss)[r] = P(lse)[r] - P(sums)[n + r];
  }
}

void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid) {
  f64("cross_entropy_shard_backward", {&dlogits_shard, &dloss, &logits_shard, &lse});
  const int64_t block = logits_shard.dim(-1);
  for (int64_t r = 0; r < rows(logits_shard); ++r) {
    const int64_t target = targets.data<int64_t>()[r] - vocab_start;
    for (int64_t j = 0; j < block; ++j) {
      // Element j is read before it is written: in place is safe.
      const double x = P(logits_shard)[r * block + j];
      W(dlogits_shard)
      [r * block + j] =
          j < valid ? P(dloss)[r] * (std::exp(x - P(lse)[r]) - (j == target ? 1.0 : 0.0)) : 0.0;
    }
  }
}

MaskedSum masked_sum(const Tensor& loss, const Tensor& mask) {
  f64("masked_sum", {&loss});
  MaskedSum s;
  for (int64_t i = 0; i < loss.numel(); ++i) {
    s.sum += P(loss)[i] * mask.item(i);
    s.count += mask.item(i);
  }
  return s;
}

void transpose_2d(Tensor& out, const Tensor& x) {
  const int64_t r = x.dim(0), c = x.dim(1);
  const size_t es = dtype_size(x.dtype());
  MEGATRON_CHECK(out.dtype() == x.dtype() && out.numel() == x.numel(), "transpose_2d: out ",
                 out.str(), " for ", x.str());
  auto* o = static_cast<char*>(out.raw());
  const auto* in = static_cast<const char*>(x.raw());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) std::memcpy(o + (j * r + i) * es, in + (i * c + j) * es, es);
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const int64_t c = x.dim(-1);
  const size_t es = dtype_size(x.dtype());
  MEGATRON_CHECK(out.dtype() == x.dtype() && out.numel() == index.numel() * c, "gather_rows: out ",
                 out.str(), " for ", x.str());
  for (int64_t r = 0; r < index.numel(); ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * c * es,
                static_cast<const char*>(x.raw()) + id_at(index, r) * c * es, c * es);
}

void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  f64("scatter_add_rows", {&out, &x});
  const int64_t c = out.dim(-1);
  for (int64_t r = 0; r < index.numel(); ++r)
    for (int64_t j = 0; j < c; ++j) W(out)[id_at(index, r) * c + j] += P(x)[r * c + j];
}

void slice_last_dim(Tensor& out, const Tensor& x, int64_t start) {
  const int64_t w = out.dim(-1), h = x.dim(-1), n = rows(x);
  const size_t es = dtype_size(x.dtype());
  MEGATRON_CHECK(out.dtype() == x.dtype() && rows(out) == n && start + w <= h,
                 "slice_last_dim: out ", out.str(), " from ", x.str(), " at ", start);
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * w * es,
                static_cast<const char*>(x.raw()) + (r * h + start) * es, w * es);
}

void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts) {
  const int64_t h = out.dim(-1), n = rows(out);
  const size_t es = dtype_size(out.dtype());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const int64_t w = p.dim(-1);
    MEGATRON_CHECK(p.dtype() == out.dtype() && rows(p) == n && at + w <= h,
                   "concat_last_dim: part ", p.str(), " into ", out.str());
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(static_cast<char*>(out.raw()) + (r * h + at) * es,
                  static_cast<const char*>(p.raw()) + r * w * es, w * es);
    at += w;
  }
  MEGATRON_CHECK(at == h, "concat_last_dim: parts fill ", at, " of ", h, " columns");
}

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec, Tensor* rounded) {
  f64("adamw_step", {&param, &exp_avg, &exp_avg_sq, &grad});
  const ref::AdamState s = ref::adamw({param, exp_avg, exp_avg_sq}, grad, spec);
  param.copy_from(s.param);
  exp_avg.copy_from(s.exp_avg);
  exp_avg_sq.copy_from(s.exp_avg_sq);
  if (rounded) rounded->copy_from(param);
}

void sgd_step(Tensor& param, Tensor& momentum_buffer, const Tensor& grad, const SgdSpec& spec,
              Tensor* rounded) {
  const bool buffer = spec.momentum != 0;
  f64("sgd_step", {&param, &grad});
  if (buffer) f64("sgd_step", {&momentum_buffer});
  for (int64_t i = 0; i < param.numel(); ++i) {
    double d = P(grad)[i] * spec.grad_scale + double{spec.weight_decay} * P(param)[i];
    if (buffer) {
      if (!spec.first) d += double{spec.momentum} * P(momentum_buffer)[i];
      W(momentum_buffer)[i] = d;
    }
    W(param)[i] -= double{spec.lr} * d;
  }
  if (rounded) rounded->copy_from(param);
}

void lion_step(Tensor& param, Tensor& exp_avg, const Tensor& grad, const LionSpec& spec,
               Tensor* rounded) {
  f64("lion_step", {&param, &exp_avg, &grad});
  const double lr = spec.lr, w1 = spec.weight1, w2 = spec.weight2, decay = spec.decay;
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double g = P(grad)[i] * spec.grad_scale, m = P(exp_avg)[i];
    const double u = m + w1 * (g - m);
    W(exp_avg)[i] = m + w2 * (g - m);
    const double w = P(param)[i] * (1 + decay);
    W(param)[i] = w - lr * (std::isnan(u) ? u : static_cast<double>((u > 0) - (u < 0)));
  }
  if (rounded) rounded->copy_from(param);
}

double sum_squares(const Tensor& x) {
  f64("sum_squares", {&x});
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += P(x)[i] * P(x)[i];
  return s;
}

double abs_max(const Tensor& x) {
  f64("abs_max", {&x});
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::fabs(P(x)[i]) > m) m = std::fabs(P(x)[i]);  // NaN compares false: ignored
  return m;
}

// Through the codec's code (fp8_encode, then fp8_decode), not the fast kernels' fp8_round.
void fp8_quantize(Tensor& out, const Tensor& x, float scale, Fp8Format format) {
  f64("fp8_quantize", {&out, &x});
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float scaled = static_cast<float>(P(x)[i]) * scale;
    W(out)[i] = fp8_decode(fp8_encode(scaled, format), format);
  }
}

// Block by block in f64 loops, through the codec; the scales from core/fp8.h's rule.
void fp8_block_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        Fp8BlockRule rule, Fp8Format format) {
  f64("fp8_block_quantize", {&out, &x});
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const int64_t r1 = std::min(rows, r0 + block_rows), c1 = std::min(cols, c0 + block_cols);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float v = std::fabs(static_cast<float>(P(x)[r * cols + c]));
          if (v > amax) amax = v;  // NaN compares false: ignored
        }
      const Fp8BlockScale s = fp8_block_scale(amax, rule, format);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float scaled = static_cast<float>(P(x)[r * cols + c]) * s.scale;
          W(out)
          [r * cols + c] =
              static_cast<double>(fp8_decode(fp8_encode(scaled, format), format)) * s.scale_inv;
        }
    }
  }
}

// Through the codec (fp8_encode, fp8_decode), not the kernels' fp8_code_of and table.
void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format) {
  f64("fp8_encode", {&x});
  auto* pc = codes.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i)
    pc[i] = fp8_encode(static_cast<float>(P(x)[i]) * scale, format);
}

void fp8_decode(Tensor& out, const Tensor& codes, Fp8Format format) {
  f64("fp8_decode", {&out});
  const auto* pc = codes.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) W(out)[i] = fp8_decode(pc[i], format);
}

namespace {
int64_t tile_of(const Fp8Tiles& t, int64_t i) {
  const int64_t g = t.offset + i, r = g / t.cols, c = g % t.cols;
  return r / t.block_rows * ((t.cols + t.block_cols - 1) / t.block_cols) + c / t.block_cols;
}
}  // namespace

// Element by element, the tile from the index arithmetic; through the codec.
void fp8_tile_abs_max(Tensor& amax, const Tensor& x, const Fp8Tiles& tiles) {
  f64("fp8_tile_abs_max", {&x});
  float* a = amax.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = std::fabs(static_cast<float>(P(x)[i]));
    float& slot = a[tile_of(tiles, i)];
    if (v > slot) slot = v;  // NaN compares false: ignored
  }
}

void fp8_tile_encode(Tensor& codes, const Tensor& x, const Fp8Tiles& tiles, const Tensor& scales,
                     Fp8Format format) {
  f64("fp8_tile_encode", {&x});
  auto* pc = codes.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i)
    pc[i] =
        fp8_encode(static_cast<float>(P(x)[i]) * scales.data<float>()[tile_of(tiles, i)], format);
}

void fp8_tile_decode(Tensor& out, const Tensor& codes, const Fp8Tiles& tiles,
                     const Tensor& scale_inv, Fp8Format format) {
  f64("fp8_tile_decode", {&out});
  const auto* pc = codes.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i)
    W(out)[i] = fp8_decode(pc[i], format) * scale_inv.data<float>()[tile_of(tiles, i)];
}

int64_t count_zeros(const Tensor& x) {
  f64("count_zeros", {&x});
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += P(x)[i] == 0.0;
  return n;
}

}  // namespace megatron::reference
