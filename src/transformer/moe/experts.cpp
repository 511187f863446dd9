// GroupedExperts: grouped GEMMs over the experts' row blocks, one activation pass over all rows.
#include "transformer/moe/experts.h"

#include <algorithm>
#include <cmath>

#include "parallel/mappings.h"
#include "tensor/ops.h"
#include "transformer/mlp.h"

namespace megatron {
namespace {

void mark_etp(Param& p, ProcessGroup& etp, int dim, int stride) {
  p.expert_parallel = true;
  p.tp_partition_dim = dim;
  p.tp_partition_stride = stride;
  p.tp_rank = etp.rank();
  p.tp_size = etp.size();
}

// The local experts' weights (or their gradients), one per group of the grouped GEMMs.
std::vector<Tensor> values(const std::vector<std::unique_ptr<Linear>>& fc) {
  std::vector<Tensor> out;
  for (const auto& l : fc) out.push_back(l->weight.value);
  return out;
}
std::vector<Tensor> grads(const std::vector<std::unique_ptr<Linear>>& fc) {
  std::vector<Tensor> out;
  for (const auto& l : fc) out.push_back(l->weight.main_grad);
  return out;
}

// probs [N] as a tensor of dtype t (f32 in training: Megatron multiplies in the probs' f32).
Tensor row_tensor(const std::vector<double>& v, DType t) {
  Tensor d = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF64);
  std::copy(v.begin(), v.end(), d.data<double>());
  return t == DType::kF64 ? d : d.to(t);
}

}  // namespace

GroupedExperts::GroupedExperts(const std::string& name, const TransformerConfig& cfg, int ep_rank,
                               int ep_size, ProcessGroup& etp)
    : cfg_(cfg) {
  const MoeConfig& m = cfg.moe;
  const int64_t local =
      divide(m.num_experts, ep_size, "--num-experts by --expert-model-parallel-size");
  first_ = ep_rank * local;
  ffn_local_ = divide(m.ffn_hidden_size, etp.size(),
                      "--moe-ffn-hidden-size by --expert-tensor-parallel-size");
  const int64_t h = cfg.hidden_size, f1 = cfg.gated_mlp() ? 2 * ffn_local_ : ffn_local_;
  const double out_std = cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  for (int64_t i = 0; i < local; ++i) {
    const std::string p = name + ".local_experts." + std::to_string(first_ + i);
    fc1_.push_back(std::make_unique<Linear>(p + ".linear_fc1", h, f1, false, cfg.init_method_std));
    fc2_.push_back(std::make_unique<Linear>(p + ".linear_fc2", ffn_local_, h, false, out_std));
    mark_etp(fc1_.back()->weight, etp, 0, cfg.gated_mlp() ? 2 : 1);
    mark_etp(fc2_.back()->weight, etp, 1, 1);
  }
}

void GroupedExperts::collect(std::vector<Param*>& out) {
  for (size_t i = 0; i < fc1_.size(); ++i) {
    fc1_[i]->collect(out);
    fc2_[i]->collect(out);
  }
}

DType GroupedExperts::gemm_dtype() const {
  return fc1_.front()->weight.value.dtype();
}

Tensor GroupedExperts::gemm_input(const Tensor& t) const {
  const DType wt = gemm_dtype();
  return t.dtype() == wt || wt == DType::kF32 ? t : t.to(wt);
}

Tensor GroupedExperts::forward(const Tensor& x, const std::vector<int64_t>& counts,
                               const std::vector<double>& probs, Ctx& ctx) const {
  const int64_t N = x.dim(0), h = cfg_.hidden_size;
  const int64_t f = ffn_local_, f1 = cfg_.gated_mlp() ? 2 * f : f;
  const DType acc = gemm_dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  ctx.counts = counts;
  ctx.probs = probs;
  ctx.x = gemm_input(x);
  ctx.pre_act = Tensor::empty({N, f1}, acc);
  ops::grouped_matmul(ctx.pre_act, ctx.x, values(fc1_), true, counts);
  ctx.act = Tensor::empty({N, f}, acc);
  if (N > 0) mlp_activation_forward(cfg_, ctx.act, ctx.pre_act);
  Tensor scaled = ctx.act.clone();
  ops::scale_rows(scaled, row_tensor(probs, acc));
  ctx.scaled = gemm_input(scaled);
  Tensor y = Tensor::empty({N, h}, acc);
  ops::grouped_matmul(y, ctx.scaled, values(fc2_), true, counts);
  return y;
}

Tensor GroupedExperts::backward(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const {
  const int64_t N = dy.dim(0);
  const int64_t f = ffn_local_, f1 = cfg_.gated_mlp() ? 2 * f : f;
  const DType acc = gemm_dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor dy_c = gemm_input(dy);
  // d(scaled) = dy fc2_e; dW2_e += dy^T scaled.
  Tensor dscaled = Tensor::empty({N, f}, acc);
  ops::grouped_matmul(dscaled, dy_c, values(fc2_), false, ctx.counts);
  std::vector<Tensor> dw2 = grads(fc2_);
  ops::grouped_matmul_at(dw2, dy_c, ctx.scaled, ctx.counts, 1.0f);
  // scaled = act * p: dp_r = <dscaled_r, act_r>, dact = dscaled * p.
  Tensor dp = Tensor::empty({N}, acc);
  ops::row_dots(dp, dscaled, ctx.act);
  const Tensor dp64 = dp.to(DType::kF64);
  dprobs->assign(dp64.data<double>(), dp64.data<double>() + N);
  ops::scale_rows(dscaled, row_tensor(ctx.probs, acc));
  Tensor dpre = Tensor::empty({N, f1}, acc);
  if (N > 0) mlp_activation_backward(cfg_, dpre, dscaled, ctx.pre_act);
  const Tensor dpre_c = gemm_input(dpre);
  Tensor dx = Tensor::empty({N, cfg_.hidden_size}, acc);
  ops::grouped_matmul(dx, dpre_c, values(fc1_), false, ctx.counts);
  std::vector<Tensor> dw1 = grads(fc1_);
  ops::grouped_matmul_at(dw1, dpre_c, ctx.x, ctx.counts, 1.0f);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
