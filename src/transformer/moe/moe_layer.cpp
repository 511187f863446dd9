// MoELayer: router, all-gather dispatch over ETP x EP, grouped experts, combine, shared experts.
#include "transformer/moe/moe_layer.h"

#include <cmath>

#include "tensor/ops.h"
#include "transformer/moe/permutation.h"

namespace megatron {
namespace {

using moe::gather_rows;
using moe::index_tensor;
using moe::scatter_add_rows;

// A size-1 group's gather and reduce-scatter are copies: skip them.
Tensor all_gather_rows(const Tensor& t, ProcessGroup& g) {
  if (g.size() == 1) return t;
  Shape s = t.shape();
  s[0] *= g.size();
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  g.all_gather(out, t);
  return out;
}
Tensor reduce_scatter_rows(const Tensor& t, ProcessGroup& g) {
  if (g.size() == 1) return t;
  Shape s = t.shape();
  s[0] /= g.size();
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  g.reduce_scatter(out, t);
  return out;
}

TransformerConfig with_ffn(const TransformerConfig& cfg, int64_t ffn) {
  TransformerConfig c = cfg;
  c.ffn_hidden_size = ffn;
  return c;
}

// The routed experts' config: LatentMoE's experts take and give rows of the latent width.
TransformerConfig experts_config(const TransformerConfig& cfg) {
  TransformerConfig c = cfg;
  if (cfg.moe.latent_size > 0) c.hidden_size = cfg.moe.latent_size;
  return c;
}

}  // namespace

MoELayer::MoELayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                   const TensorParallelContext& tp)
    : experts_cfg_(experts_config(cfg)),
      router(name + ".router", cfg, layer_number, tp),
      experts(name + ".experts", experts_cfg_, tp.with_default_experts().expert.ep_rank,
              tp.with_default_experts().expert.ep_size, *tp.with_default_experts().expert.etp),
      shared_cfg_(with_ffn(cfg, cfg.moe.shared_expert_intermediate_size)),
      cfg_(cfg),
      tp_(tp.with_default_experts()) {
  if (cfg.moe.shared_expert_intermediate_size > 0)
    shared_experts = std::make_unique<MLP>(name + ".shared_experts", shared_cfg_, tp);
  if (shared_experts)
    shared_experts->set_recompute(cfg.recomputes(&RecomputeModules::shared_experts));
  if (shared_experts && cfg.moe.shared_expert_gate) {
    // Megatron's gate_weight [1, h]: init_method's normal, replicated over TP.
    shared_expert_gate = std::make_unique<Linear>(name + ".shared_experts.gate", cfg.hidden_size, 1,
                                                  false, cfg.init_method_std);
    shared_expert_gate->weight.name = name + ".shared_experts.gate_weight";
    shared_expert_gate->weight.sequence_parallel = tp.sp();
  }
  if (cfg.moe.latent_size > 0) {
    // Megatron's init_method and output_layer_init_method.
    const int64_t h = cfg.hidden_size, L = cfg.moe.latent_size;
    fc1_latent_proj = std::make_unique<Linear>(name + ".fc1_latent_proj", h, L, cfg.add_bias_linear,
                                               cfg.init_method_std);
    fc2_latent_proj = std::make_unique<Linear>(name + ".fc2_latent_proj", L, h, cfg.add_bias_linear,
                                               cfg.output_init_std());
    for (Linear* l : {fc1_latent_proj.get(), fc2_latent_proj.get()}) {
      l->weight.sequence_parallel = tp.sp();
      l->bias.sequence_parallel = tp.sp();
    }
  }
  if (!tp_.expert.ep) {
    self_ = make_self_process_group();
    tp_.expert.ep = self_.get();
  }
}

Tensor MoELayer::forward_alltoall(const Tensor& flat, Ctx& ctx) const {
  const int64_t E = cfg_.moe.num_experts;
  const moe::Routing& r = ctx.router.routing;
  // The padded rows carry probability 0 (r.probs is 0 off the routing's map) and their
  // probability gradients are dropped by the router's backward, which reads r.map.
  const std::vector<uint8_t> map =
      cfg_.moe.router_padding_for_fp8
          ? moe::pad_routing_map(r.map, ctx.tokens, E, cfg_.fp8.align_size())
          : r.map;
  ctx.plan = AllToAllPlan(map, ctx.tokens, E, experts.first_expert(), experts.num_local(),
                          *tp_.expert.ep, *tp_.expert.etp);
  const AllToAllPlan& plan = ctx.plan;
  const auto A = static_cast<int64_t>(plan.send_tokens().size());
  Tensor probs = Tensor::empty({A, 1}, DType::kF64);
  for (int64_t a = 0; a < A; ++a)
    probs.data<double>()[a] = r.probs[plan.send_tokens()[a] * E + plan.send_experts()[a]];
  const Tensor p = plan.to_experts(probs);
  const std::vector<double> p_perm(p.data<double>(), p.data<double>() + p.numel());
  const Tensor x_perm = plan.to_experts(gather_rows(experts.gemm_input(flat), plan.send_index()));
  const Tensor y_perm = experts.forward(x_perm, plan.counts(), p_perm, ctx.experts);
  return scatter_add_rows(plan.from_experts(y_perm), plan.send_index(), ctx.tokens);
}

Tensor MoELayer::backward_alltoall(const Tensor& dflat, Ctx& ctx,
                                   std::vector<double>& dprobs) const {
  const int64_t E = cfg_.moe.num_experts;
  const AllToAllPlan& plan = ctx.plan;
  std::vector<double> dprobs_perm;
  const Tensor dx_perm =
      experts.backward(plan.to_experts(gather_rows(experts.gemm_input(dflat), plan.send_index())),
                       ctx.experts, &dprobs_perm);
  Tensor dp = Tensor::empty({static_cast<int64_t>(dprobs_perm.size()), 1}, DType::kF64);
  std::copy(dprobs_perm.begin(), dprobs_perm.end(), dp.data<double>());
  const Tensor dp_assign = plan.from_experts(dp);
  dprobs.assign(static_cast<size_t>(ctx.tokens * E), 0.0);
  for (int64_t a = 0; a < dp_assign.numel(); ++a)
    dprobs[plan.send_tokens()[a] * E + plan.send_experts()[a]] += dp_assign.data<double>()[a];
  return scatter_add_rows(plan.from_experts(dx_perm), plan.send_index(), ctx.tokens);
}

void MoELayer::collect(std::vector<Param*>& out) {
  router.collect(out);
  experts.collect(out);
  if (shared_experts) shared_experts->collect(out);
  if (shared_expert_gate) shared_expert_gate->collect(out);
  if (fc1_latent_proj) {
    fc1_latent_proj->collect(out);
    fc2_latent_proj->collect(out);
  }
}

Tensor MoELayer::forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const {
  const int64_t h = cfg_.hidden_size;
  ctx.in_shape = x.shape();
  ctx.tokens = x.numel() / h;
  const Tensor flat = x.view({ctx.tokens, h});
  router.forward(flat, x.dim(1), ctx.router, mode);
  const Tensor rows = fc1_latent_proj ? fc1_latent_proj->forward(flat, ctx.latent_in) : flat;
  const Tensor combined = cfg_.moe.dispatcher == MoeDispatcher::kAllToAll
                              ? forward_alltoall(rows, ctx)
                              : routed_forward(rows, ctx);
  Tensor y = (fc2_latent_proj ? fc2_latent_proj->forward(combined, ctx.latent_out) : combined)
                 .view(x.shape());
  if (shared_experts) ops::add_inplace(y, shared_forward(x, ctx));
  return y;
}

namespace {

// sigmoid of each of the T gate logits [T, 1], as a [T] vector of `dtype` (one value per token:
// a host loop in double).
Tensor sigmoid_rows(const Tensor& z, DType dtype) {
  const Tensor z64 = z.dtype() == DType::kF64 ? z : z.to(DType::kF64);
  Tensor g = Tensor::empty({z.numel()}, DType::kF64);
  for (int64_t t = 0; t < z.numel(); ++t)
    g.data<double>()[t] = 1.0 / (1.0 + std::exp(-z64.data<double>()[t]));
  return dtype == DType::kF64 ? g : g.to(dtype);
}

}  // namespace

Tensor MoELayer::shared_forward(const Tensor& x, Ctx& ctx) const {
  Tensor s = shared_experts->forward(x, ctx.shared).view(x.shape());
  if (!shared_expert_gate) return s;
  const int64_t h = cfg_.hidden_size;
  Tensor z = shared_expert_gate->forward(x.view({ctx.tokens, h}), ctx.gate);  // [T, 1]
  MEGATRON_CHECK(s.device() == Device::kCPU,
                 "--moe-shared-expert-gate runs on the CPU only (drop --device cuda)");
  // y = s * sigmoid(z) per token (ops::scale_rows, in s's dtype).
  Tensor g = sigmoid_rows(z, s.dtype());
  Tensor y = s.clone().view({ctx.tokens, h});
  ops::scale_rows(y, g);
  ctx.shared_out = s;
  ctx.gate_score = g;
  return y.view(s.shape());
}

Tensor MoELayer::shared_backward(const Tensor& dy, Ctx& ctx) const {
  if (!shared_expert_gate) return shared_experts->backward(dy, ctx.shared).view(ctx.in_shape);
  const int64_t h = cfg_.hidden_size;
  const Tensor& s = ctx.shared_out;
  const Tensor d = (dy.dtype() == s.dtype() ? dy : dy.to(s.dtype())).view({ctx.tokens, h});
  // ds = dy * g per token; dz_t = g_t (1 - g_t) sum_j dy_tj s_tj (the logit's gradient through
  // the sigmoid; the row dot products accumulated in double by ops::row_dots).
  Tensor ds = d.clone();
  ops::scale_rows(ds, ctx.gate_score);
  Tensor dots = Tensor::empty({ctx.tokens}, s.dtype());
  ops::row_dots(dots, d, s.view({ctx.tokens, h}));
  const Tensor dots64 = dots.dtype() == DType::kF64 ? dots : dots.to(DType::kF64);
  const Tensor g64 =
      ctx.gate_score.dtype() == DType::kF64 ? ctx.gate_score : ctx.gate_score.to(DType::kF64);
  Tensor dz = Tensor::empty({ctx.tokens, 1}, DType::kF64);
  for (int64_t t = 0; t < ctx.tokens; ++t) {
    const double gt = g64.data<double>()[t];
    dz.data<double>()[t] = dots64.data<double>()[t] * gt * (1 - gt);
  }
  if (s.dtype() != DType::kF64) dz = dz.to(s.dtype());
  Tensor dx = shared_experts->backward(ds, ctx.shared).view(ctx.in_shape);
  Tensor dx_gate = shared_expert_gate->backward(dz, ctx.gate);
  ops::add_inplace(
      dx, (dx_gate.dtype() == dx.dtype() ? dx_gate : dx_gate.to(dx.dtype())).view(ctx.in_shape));
  return dx;
}

Tensor MoELayer::routed_forward(const Tensor& flat, Ctx& ctx) const {
  const int64_t E = cfg_.moe.num_experts;
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
  // Tokens move in the experts' GEMM dtype (bf16 in bf16 training): half the bytes.
  const Tensor x_all = all_gather_rows(experts.gemm_input(flat), g);
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
  ctx.index = index_tensor(ctx.rows);
  const Tensor y_perm = experts.forward(gather_rows(x_all, ctx.index), counts, probs, ctx.experts);
  return reduce_scatter_rows(scatter_add_rows(y_perm, ctx.index, ctx.gathered), g);
}

Tensor MoELayer::backward(const Tensor& dy, Ctx& ctx) const {
  const int64_t h = cfg_.hidden_size;
  const Tensor dflat = dy.view({ctx.tokens, h});
  const Tensor dcombined =
      fc2_latent_proj ? fc2_latent_proj->backward(dflat, ctx.latent_out) : dflat;
  std::vector<double> dprobs;
  Tensor dx = cfg_.moe.dispatcher == MoeDispatcher::kAllToAll
                  ? backward_alltoall(dcombined, ctx, dprobs)
                  : routed_backward(dcombined, ctx, dprobs);
  if (fc1_latent_proj) dx = fc1_latent_proj->backward(dx, ctx.latent_in);
  const Tensor dx_router = router.backward(dprobs, ctx.router);
  ops::add_inplace(dx, dx_router.dtype() == dx.dtype() ? dx_router : dx_router.to(dx.dtype()));
  dx = dx.view(ctx.in_shape);
  if (shared_experts) ops::add_inplace(dx, shared_backward(dy, ctx));
  ctx = Ctx{};
  return dx;
}

Tensor MoELayer::routed_backward(const Tensor& dflat, Ctx& ctx, std::vector<double>& d) const {
  const int64_t E = cfg_.moe.num_experts;
  ProcessGroup& g = dispatch_group();
  const Tensor dy_all = all_gather_rows(experts.gemm_input(dflat), g);
  std::vector<double> dprobs_perm;
  const Tensor dx_perm =
      experts.backward(gather_rows(dy_all, ctx.index), ctx.experts, &dprobs_perm);
  Tensor dx = reduce_scatter_rows(scatter_add_rows(dx_perm, ctx.index, ctx.gathered), g);

  // The probabilities' gradients back to their tokens' ranks (summed over ETP partials).
  Tensor dprobs_all = Tensor::zeros({ctx.gathered, E}, DType::kF64);
  double* dp = dprobs_all.data<double>();
  const int64_t first = experts.first_expert();
  for (size_t i = 0; i < ctx.rows.size(); ++i)
    dp[ctx.rows[i] * E + first + ctx.experts_of[i]] += dprobs_perm[i];
  const Tensor dprobs = reduce_scatter_rows(dprobs_all, g);
  d.assign(dprobs.data<double>(), dprobs.data<double>() + dprobs.numel());
  return dx;
}

}  // namespace megatron
