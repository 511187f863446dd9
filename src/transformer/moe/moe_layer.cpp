// MoELayer: router, all-gather dispatch over ETP x EP, grouped experts, combine, shared experts.
#include "transformer/moe/moe_layer.h"

#include <cstring>

#include "tensor/ops.h"

namespace megatron {
namespace {

// out[r] = in[index[r]] for rows of any dtype.
Tensor gather_rows(const Tensor& in, const std::vector<int64_t>& index) {
  const int64_t c = in.dim(-1), n = static_cast<int64_t>(index.size());
  Tensor out = Tensor::empty({n, c}, in.dtype());
  const size_t row = static_cast<size_t>(c) * dtype_size(in.dtype());
  const char* src = static_cast<const char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * row, src + index[r] * row, row);
  return out;
}

// out[index[r]] += in[r] (rows in order: deterministic sums), out [rows, c] zero-initialised.
template <typename T>
void scatter_add_rows_as(Tensor& out, const Tensor& in, const std::vector<int64_t>& index) {
  const int64_t c = in.dim(-1);
  T* o = out.data<T>();
  const T* x = in.data<T>();
  for (size_t r = 0; r < index.size(); ++r)
    for (int64_t j = 0; j < c; ++j) o[index[r] * c + j] += x[static_cast<int64_t>(r) * c + j];
}
Tensor scatter_add_rows(const Tensor& in, const std::vector<int64_t>& index, int64_t rows) {
  Tensor out = Tensor::zeros({rows, in.dim(-1)}, in.dtype());
  if (in.dtype() == DType::kF64) {
    scatter_add_rows_as<double>(out, in, index);
  } else {
    scatter_add_rows_as<float>(out, in, index);
  }
  return out;
}

// A size-1 group's gather and reduce-scatter are copies: skip them.
Tensor all_gather_rows(const Tensor& t, ProcessGroup& g) {
  if (g.size() == 1) return t;
  Shape s = t.shape();
  s[0] *= g.size();
  Tensor out = Tensor::empty(s, t.dtype());
  g.all_gather(out, t);
  return out;
}
Tensor reduce_scatter_rows(const Tensor& t, ProcessGroup& g) {
  if (g.size() == 1) return t;
  Shape s = t.shape();
  s[0] /= g.size();
  Tensor out = Tensor::empty(s, t.dtype());
  g.reduce_scatter(out, t);
  return out;
}

TransformerConfig with_ffn(const TransformerConfig& cfg, int64_t ffn) {
  TransformerConfig c = cfg;
  c.ffn_hidden_size = ffn;
  return c;
}

}  // namespace

MoELayer::MoELayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                   const TensorParallelContext& tp)
    : router(name + ".router", cfg, layer_number, tp),
      experts(name + ".experts", cfg, tp.with_default_experts().expert.ep_rank,
              tp.with_default_experts().expert.ep_size, *tp.with_default_experts().expert.etp),
      shared_cfg_(with_ffn(cfg, cfg.moe.shared_expert_intermediate_size)),
      cfg_(cfg),
      tp_(tp.with_default_experts()) {
  if (cfg.moe.shared_expert_intermediate_size > 0)
    shared_experts = std::make_unique<MLP>(name + ".shared_experts", shared_cfg_, tp);
}

void MoELayer::collect(std::vector<Param*>& out) {
  router.collect(out);
  experts.collect(out);
  if (shared_experts) shared_experts->collect(out);
}

Tensor MoELayer::forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const {
  const int64_t h = cfg_.hidden_size, E = cfg_.moe.num_experts;
  ctx.in_shape = x.shape();
  ctx.tokens = x.numel() / h;
  const Tensor flat = x.view({ctx.tokens, h});
  router.forward(flat, x.dim(1), ctx.router, mode);

  // Gather the group's tokens with their probabilities and map ([T, 2E]: probs | map).
  ProcessGroup& g = dispatch_group();
  const moe::Routing& r = ctx.router.routing;
  Tensor route = Tensor::empty({ctx.tokens, 2 * E}, DType::kF64);
  double* rt = route.data<double>();
  for (int64_t t = 0; t < ctx.tokens; ++t)
    for (int64_t e = 0; e < E; ++e) {
      rt[t * 2 * E + e] = r.probs[t * E + e];
      rt[t * 2 * E + E + e] = r.map[t * E + e];
    }
  const Tensor x_all = all_gather_rows(flat, g);
  const Tensor route_all = all_gather_rows(route, g);
  ctx.gathered = x_all.dim(0);

  // Permute: the rows of each local expert in token order, experts in order.
  const int64_t first = experts.first_expert(), local = experts.num_local();
  const double* ra = route_all.data<double>();
  std::vector<int64_t> counts(static_cast<size_t>(local), 0);
  std::vector<double> probs;
  ctx.rows.clear();
  ctx.experts_of.clear();
  for (int64_t e = 0; e < local; ++e)
    for (int64_t t = 0; t < ctx.gathered; ++t)
      if (ra[t * 2 * E + E + first + e] != 0) {
        ctx.rows.push_back(t);
        ctx.experts_of.push_back(e);
        probs.push_back(ra[t * 2 * E + first + e]);
        ++counts[e];
      }
  const Tensor y_perm = experts.forward(gather_rows(x_all, ctx.rows), counts, probs, ctx.experts);
  Tensor y = reduce_scatter_rows(scatter_add_rows(y_perm, ctx.rows, ctx.gathered), g);
  y = y.view(x.shape());
  if (shared_experts) ops::add_inplace(y, shared_experts->forward(x, ctx.shared).view(x.shape()));
  return y;
}

Tensor MoELayer::backward(const Tensor& dy, Ctx& ctx) const {
  const int64_t h = cfg_.hidden_size, E = cfg_.moe.num_experts;
  ProcessGroup& g = dispatch_group();
  const Tensor dflat = dy.view({ctx.tokens, h});
  const Tensor dy_all = all_gather_rows(dflat, g);
  std::vector<double> dprobs_perm;
  const Tensor dx_perm =
      experts.backward(gather_rows(dy_all, ctx.rows), ctx.experts, &dprobs_perm);
  Tensor dx = reduce_scatter_rows(scatter_add_rows(dx_perm, ctx.rows, ctx.gathered), g);

  // The probabilities' gradients back to their tokens' ranks (summed over ETP partials).
  Tensor dprobs_all = Tensor::zeros({ctx.gathered, E}, DType::kF64);
  double* dp = dprobs_all.data<double>();
  const int64_t first = experts.first_expert();
  for (size_t i = 0; i < ctx.rows.size(); ++i)
    dp[ctx.rows[i] * E + first + ctx.experts_of[i]] += dprobs_perm[i];
  const Tensor dprobs = reduce_scatter_rows(dprobs_all, g);
  std::vector<double> d(dprobs.data<double>(), dprobs.data<double>() + dprobs.numel());
  const Tensor dx_router = router.backward(d, ctx.router);
  ops::add_inplace(dx, dx_router.dtype() == dx.dtype() ? dx_router : dx_router.to(dx.dtype()));
  dx = dx.view(ctx.in_shape);
  if (shared_experts) ops::add_inplace(dx, shared_experts->backward(dy, ctx.shared).view(ctx.in_shape));
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
