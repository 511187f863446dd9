// TopKRouter: gating GEMM, routing, load-balancing losses and their gradients, expert bias.
#include "transformer/moe/router.h"

#include <cmath>

#include "core/philox.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

// Sums v over the TP group and then the CP group (= over TP x CP: the groups are orthogonal).
void sum_over_tp_cp(std::vector<double>& v, const TensorParallelContext& tp) {
  if (tp.size() == 1 && !tp.cp.enabled()) return;
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF64);
  std::copy(v.begin(), v.end(), t.data<double>());
  tp.group->all_reduce(t);
  if (tp.cp.enabled()) tp.cp.group->all_reduce(t);
  std::copy(t.data<double>(), t.data<double>() + v.size(), v.begin());
}

std::vector<double> to_f64(const Tensor& t) {
  Tensor d = t.dtype() == DType::kF64 ? t : t.to(DType::kF64);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

}  // namespace

TopKRouter::TopKRouter(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                       const TensorParallelContext& tp)
    : cfg_(cfg), layer_(layer_number), tp_(tp) {
  const int64_t E = cfg.moe.num_experts;
  weight.name = name + ".weight";
  weight.shape = {E, cfg.hidden_size};
  weight.init_std = cfg.init_method_std;
  weight.tp_rank = tp.rank();  // replicated over TP: counted once in norms
  weight.tp_size = tp.size();
  weight.sequence_parallel = tp.sp();
  if (cfg.add_bias_linear) {
    // Megatron core 0.19's router bias (gpt-oss): in the gating linear, drawn with init_method
    // like the weight; 1-D, so no weight decay.
    bias.name = name + ".bias";
    bias.shape = {E};
    bias.init_std = cfg.init_method_std;
    bias.no_weight_decay = true;
    bias.tp_rank = tp.rank();
    bias.tp_size = tp.size();
    bias.sequence_parallel = tp.sp();
  }
  if (cfg.moe.enable_expert_bias) {
    expert_bias.name = name + ".expert_bias";
    expert_bias.shape = {E};
    expert_bias.init = Init::kZeros;
    expert_bias.no_weight_decay = true;
    expert_bias.frozen = true;
    expert_bias.tp_rank = tp.rank();
    expert_bias.tp_size = tp.size();
  }
  tokens_per_expert_.assign(static_cast<size_t>(E), 0.0);
}

void TopKRouter::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (!bias.name.empty()) out.push_back(&bias);
  if (has_expert_bias()) out.push_back(&expert_bias);
}

int64_t TopKRouter::global_token(int64_t t, int64_t T, int64_t batch) const {
  const int64_t sp_row0 = tp_.sp() ? tp_.rank() * T : 0;
  const int64_t cp_local = (tp_.sp() ? T * tp_.size() : T) / batch;  // CP-local positions
  const int64_t row = sp_row0 + t, s = row / batch, b = row % batch;
  return tp_.cp.global_row(s, cp_local) * batch + b;
}

void TopKRouter::forward(const Tensor& x, int64_t batch, Ctx& ctx, const ForwardMode& mode) const {
  const MoeConfig& m = cfg_.moe;
  const int64_t h = cfg_.hidden_size, E = m.num_experts, T = x.numel() / h;
  ctx = Ctx{};
  ctx.training = mode.training;
  Tensor xin = x.view({T, h});
  if (mode.training && m.input_jitter_eps > 0) {
    // x * U(1 - eps, 1 + eps), one draw per element keyed by the token's place in the whole
    // micro-batch, so every TP / CP layout draws the same noise for the same token.
    ctx.jitter = Tensor::empty({T, h}, xin.dtype(), xin.device());
    const uint64_t stream = mode.site_stream(layer_, 3);
    std::vector<double> noise(static_cast<size_t>(T * h));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t global = global_token(t, T, batch);
      for (int64_t c = 0; c < h; ++c) {
        const float u = Philox::uniform(mode.seed, stream, static_cast<uint64_t>(global * h + c));
        noise[t * h + c] = 1.0 - m.input_jitter_eps + 2.0 * m.input_jitter_eps * u;
      }
    }
    Tensor n64 = Tensor::empty({T, h}, DType::kF64);
    std::copy(noise.begin(), noise.end(), n64.data<double>());
    ctx.jitter.copy_from(n64);  // the noise in the activations' dtype
    Tensor jittered = Tensor::empty({T, h}, xin.dtype(), xin.device());
    ops::mul(jittered, xin, ctx.jitter);
    xin = jittered;
  }
  // The gating GEMM in --moe-router-dtype (fp32/fp64 widen the compute weights), else in the
  // compute dtype as Megatron's router_gating_linear.
  const DType gemm = m.router_dtype == "fp64" || weight.value.dtype() == DType::kF64 ? DType::kF64
                     : m.router_dtype == "fp32" || weight.value.dtype() == DType::kF32
                         ? DType::kF32
                         : weight.value.dtype();
  ctx.x = xin.dtype() == gemm ? xin : xin.to(gemm);
  Tensor logits = Tensor::empty({T, E}, gemm == DType::kF64 ? DType::kF64 : DType::kF32);
  ops::matmul(logits, ctx.x, false, weight.value_as(gemm), true);
  if (!bias.name.empty()) ops::bias_add(logits, bias.value_as(logits.dtype()));
  ctx.logits = to_f64(logits);
  if (m.force_load_balancing) {
    // Megatron's RandomSTE: the routing sees N(0, 1) logits; backward hands their gradient to
    // the GEMM unchanged. Drawn per token of the whole micro-batch (as the jitter), so every
    // layout routes alike, and the same again when a recomputation repeats the forward. Outside
    // training (evaluation, generation: no per-step seed) each forward draws anew, as Megatron's
    // generator moves on with every call.
    const uint64_t stream = mode.site_stream(layer_, 6) + (mode.training ? 0 : ++eval_draws_ << 32);
    for (int64_t t = 0; t < T; ++t) {
      const uint64_t token = static_cast<uint64_t>(global_token(t, T, batch));
      for (int64_t e = 0; e < E; ++e)
        ctx.logits[static_cast<size_t>(t * E + e)] = Philox::normal(
            mode.seed, stream, token * static_cast<uint64_t>(E) + static_cast<uint64_t>(e));
    }
  }

  // The bias from the fp32 main copy (Megatron keeps it in fp32): a bf16 compute copy would
  // round away updates of 1e-3 once |bias| > 0.25.
  std::vector<double> score_bias;
  if (has_expert_bias()) score_bias = to_f64(expert_bias.main);
  ctx.routing = moe::route(ctx.logits, T, m, score_bias, mode.training);

  if (!mode.training) return;
  ctx.tracker = mode.moe_tracker;
  const int tp_cp = tp_.size() * tp_.cp.size();
  // Each rank's losses are its shares of the micro-batch's (summed over TP x CP). The router's
  // gradient is summed over TP (sequence parallel) but averaged over CP with the data-parallel
  // replicas, so the CP ranks' shares are weighted by CP to give the whole loss's gradient
  // (Megatron r0.14 leaves the 1/CP in: its CP runs weigh the losses less than one process).
  // With --calculate-per-token-loss gradients are summed, not averaged: the micro-batch's tokens
  // instead, as the main loss's gradient is divided by the global token count later.
  const double grad_scale =
      mode.aux_loss_scale *
      (mode.aux_per_token ? static_cast<double>(T) * tp_cp : static_cast<double>(tp_.cp.size()));
  // A repeated MTP block's application: the load-balancing losses count its share in gradient
  // and log, the z-loss in the log only (Megatron 0.19 attaches the z-loss's gradient before
  // dividing it by mtp_num_layers).
  const double share = mode.moe_aux_share;
  const double aux_coeff = m.coeff_of(MoeLoadBalancing::kAuxLoss);
  const double seq_coeff = m.coeff_of(MoeLoadBalancing::kSeqAuxLoss);
  if (aux_coeff == 0 && seq_coeff == 0 && m.z_loss_coeff == 0) return;
  ctx.dlogits_aux.assign(static_cast<size_t>(T * E), 0.0);
  if (m.z_loss_coeff > 0) {
    // The z-loss of this rank's tokens, weighted 1 / |TP x CP| so that the sum over TP x CP is
    // the mean over the micro-batch; logged the same way (the tracker sums over TP x CP).
    const double coeff = m.z_loss_coeff / tp_cp;
    const double v = moe::z_loss(ctx.logits, T, E, coeff, grad_scale, &ctx.dlogits_aux);
    ctx.logged.emplace_back("z_loss", share * v / tp_cp);
  }
  if (aux_coeff > 0 || seq_coeff > 0) {
    const moe::AuxScores a = moe::aux_scores(ctx.logits, T, m);
    std::vector<double> dscores(static_cast<size_t>(T * E), 0.0);
    if (aux_coeff > 0) {
      std::vector<double> counts = moe::aux_counts(a, T, E);
      sum_over_tp_cp(counts, tp_);
      const double loss =
          moe::aux_loss(a, T, E, m.router_topk, counts, static_cast<double>(T) * tp_cp, aux_coeff,
                        share * grad_scale, &dscores);
      ctx.logged.emplace_back("load_balancing_loss", share * loss / aux_coeff);
    }
    if (seq_coeff > 0) {
      std::vector<double> counts = moe::aux_counts(a, T, E, batch);
      sum_over_tp_cp(counts, tp_);
      const double seq_tokens = static_cast<double>(T / batch) * tp_cp;
      const double loss = moe::seq_aux_loss(a, T, E, m.router_topk, batch, counts, seq_tokens,
                                            seq_coeff, share * grad_scale, &dscores);
      ctx.logged.emplace_back("seq_load_balancing_loss", share * loss / seq_coeff);
    }
    moe::aux_scores_backward(ctx.logits, T, m, dscores, ctx.dlogits_aux);
  }
}

Tensor TopKRouter::backward(const std::vector<double>& dprobs, Ctx& ctx) const {
  const int64_t h = cfg_.hidden_size, E = cfg_.moe.num_experts;
  const int64_t T = ctx.routing.tokens;
  std::vector<double> dlogits(static_cast<size_t>(T * E), 0.0);
  moe::route_backward(ctx.routing, cfg_.moe, dprobs, dlogits);
  if (!ctx.dlogits_aux.empty())
    for (size_t i = 0; i < dlogits.size(); ++i) dlogits[i] += ctx.dlogits_aux[i];
  if (ctx.training) {
    // Once per training micro-batch, also when its forward was recomputed.
    if (ctx.tracker)
      for (const auto& [name, v] : ctx.logged) ctx.tracker->add(name, layer_, v);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) tokens_per_expert_[e] += ctx.routing.map[t * E + e];
  }
  const DType gemm = ctx.x.dtype();
  const DType out = gemm == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor dl = Tensor::empty({T, E}, DType::kF64);
  std::copy(dlogits.begin(), dlogits.end(), dl.data<double>());
  Tensor dl_g = dl.to(gemm);
  Tensor dx = Tensor::empty({T, h}, out);
  ops::matmul(dx, dl_g, false, weight.value_as(gemm), false);
  if (!weight.main_grad.defined()) {
    // frozen without gradient storage (Param::requires_grad): no weight gradient
  } else if (out == weight.main_grad.dtype()) {
    Tensor dw = weight.main_grad;
    ops::matmul(dw, dl_g, true, ctx.x, false, 1.0f);
  } else {  // an fp64 gating GEMM in an fp32 model: its weight gradient added in fp32
    Tensor dw = Tensor::empty(weight.main_grad.shape(), out);
    ops::matmul(dw, dl_g, true, ctx.x, false);
    Tensor g = weight.main_grad;
    ops::add_inplace(g, dw.to(g.dtype()));
  }
  if (!bias.name.empty() && bias.main_grad.defined()) {  // d bias = the column sums of dlogits
    Tensor db = Tensor::zeros(bias.shape, out);
    ops::bias_backward(db, dl.dtype() == out ? dl : dl.to(out));
    Tensor g = bias.main_grad;
    ops::add_inplace(g, db.dtype() == g.dtype() ? db : db.to(g.dtype()));
  }
  // Back in the activations' dtype (an fp64 gating GEMM in an fp32 model returns f64).
  if (ctx.jitter.defined() && dx.dtype() != ctx.jitter.dtype()) dx = dx.to(ctx.jitter.dtype());
  if (ctx.jitter.defined()) ops::mul(dx, dx, ctx.jitter);
  ctx = Ctx{};
  return dx;
}

void TopKRouter::update_expert_bias(const std::vector<double>& global_counts) {
  if (!has_expert_bias()) return;
  const int64_t E = cfg_.moe.num_experts;
  double mean = 0;
  for (double c : global_counts) mean += c;
  mean /= static_cast<double>(E);
  // bias += rate * sign(mean - count), on the fp32 main copy and the compute copy alike (every
  // rank applies the same update, so replicas stay identical).
  std::vector<double> b = to_f64(expert_bias.main);
  for (int64_t e = 0; e < E; ++e) {
    const double off = mean - global_counts[e];
    b[e] += cfg_.moe.bias_update_rate * (off > 0 ? 1.0 : off < 0 ? -1.0 : 0.0);
  }
  Tensor t = Tensor::empty({E}, DType::kF64);
  std::copy(b.begin(), b.end(), t.data<double>());
  expert_bias.main.copy_from(t);
  if (expert_bias.value.raw() != expert_bias.main.raw()) expert_bias.value.copy_from(t);
}

void TopKRouter::clear_tokens_per_expert() const {
  std::fill(tokens_per_expert_.begin(), tokens_per_expert_.end(), 0.0);
}

}  // namespace megatron
