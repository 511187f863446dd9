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

// Expert biases (--add-bias-linear with MoE, gpt-oss; Megatron core 0.19's TEGroupedMLP): fc1's
// bias joins each expert's rows before the activation; fc2's, as Megatron's _apply_bias, joins
// each row scaled by the row's probability, so that the layer's output is p_r expert_e(x_r) with
// the whole expert (bias included) weighted.
void add_fc1_bias(Tensor& pre_act, const std::vector<std::unique_ptr<Linear>>& fc1,
                  const std::vector<int64_t>& counts) {
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) {
      Tensor rows = pre_act.slice0(row, row + counts[g]);
      ops::bias_add(rows, fc1[g]->bias.value_as(pre_act.dtype()));
    }
    row += counts[g];
  }
}

// fc2's bias rows of block g, each scaled by its probability: [counts[g], h].
Tensor scaled_bias_rows(const Linear& fc2, int64_t count, const Tensor& probs, DType t) {
  Tensor rows = Tensor::zeros({count, fc2.bias.shape[0]}, t);
  ops::bias_add(rows, fc2.bias.value_as(t));
  ops::scale_rows(rows, probs);
  return rows;
}

void add_fc2_bias(Tensor& y, const std::vector<std::unique_ptr<Linear>>& fc2,
                  const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const Tensor p = row_tensor(probs, y.dtype());
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) {
      Tensor rows = y.slice0(row, row + counts[g]);
      ops::add_inplace(
          rows, scaled_bias_rows(*fc2[g], counts[g], p.slice0(row, row + counts[g]), y.dtype()));
    }
    row += counts[g];
  }
}

// d fc2.bias_g += sum_r p_r dy_r; dprobs_r += dy_r . fc2.bias_g.
void fc2_bias_backward(const Tensor& dy, const std::vector<std::unique_ptr<Linear>>& fc2,
                       const std::vector<int64_t>& counts, const std::vector<double>& probs,
                       std::vector<double>* dprobs) {
  const DType t = dy.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor dyt = dy.dtype() == t ? dy : dy.to(t);
  const Tensor p = row_tensor(probs, t);
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t n = counts[g];
    if (n > 0) {
      const Tensor d = dyt.slice0(row, row + n);
      Tensor ones = Tensor::full({n}, 1.0, t);
      Tensor dp = Tensor::empty({n}, t);
      ops::row_dots(dp, d, scaled_bias_rows(*fc2[g], n, ones, t));
      const Tensor dp64 = dp.to(DType::kF64);
      for (int64_t i = 0; i < n; ++i) (*dprobs)[row + i] += dp64.data<double>()[i];
      if (fc2[g]->bias.main_grad.defined()) {
        Tensor weighted = d.clone();
        ops::scale_rows(weighted, p.slice0(row, row + n));
        Tensor& db = const_cast<Tensor&>(fc2[g]->bias.main_grad);
        ops::bias_backward(db, weighted);
      }
    }
    row += n;
  }
}

// d fc1.bias_g += sum over the expert's rows of dpre.
void fc1_bias_backward(const Tensor& dpre, const std::vector<std::unique_ptr<Linear>>& fc1,
                       const std::vector<int64_t>& counts) {
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0 && fc1[g]->bias.main_grad.defined()) {
      Tensor& db = const_cast<Tensor&>(fc1[g]->bias.main_grad);
      ops::bias_backward(db, dpre.slice0(row, row + counts[g]));
    }
    row += counts[g];
  }
}

}  // namespace

GroupedExperts::GroupedExperts(const std::string& name, const TransformerConfig& cfg, int ep_rank,
                               int ep_size, ProcessGroup& etp)
    : cfg_(cfg) {
  const MoeConfig& m = cfg.moe;
  const int64_t local =
      divide(m.num_experts, ep_size, "--num-experts by --expert-model-parallel-size");
  first_ = ep_rank * local;
  recompute_act_ = cfg.recomputes(&RecomputeModules::moe_act);
  etp_rank_ = etp.rank();
  etp_size_ = etp.size();
  ffn_local_ = divide(m.ffn_hidden_size, etp.size(),
                      "--moe-ffn-hidden-size by --expert-tensor-parallel-size");
  const int64_t h = cfg.hidden_size, f1 = cfg.gated_mlp() ? 2 * ffn_local_ : ffn_local_;
  const double out_std = cfg.output_init_std();
  for (int64_t i = 0; i < local; ++i) {
    const std::string p = name + ".local_experts." + std::to_string(first_ + i);
    fc1_.push_back(std::make_unique<Linear>(p + ".linear_fc1", h, f1, cfg.add_bias_linear,
                                            cfg.init_method_std));
    fc2_.push_back(
        std::make_unique<Linear>(p + ".linear_fc2", ffn_local_, h, cfg.add_bias_linear, out_std));
    mark_etp(fc1_.back()->weight, etp, 0, cfg.gated_mlp() ? 2 : 1);
    mark_etp(fc2_.back()->weight, etp, 1, 1);
    if (cfg.add_bias_linear) {
      // fc2's bias joins whole outputs, which expert tensor parallelism leaves as partial sums
      // (refused); fc1's would split like its rows.
      MEGATRON_CHECK(etp.size() == 1,
                     "MoE expert biases (--add-bias-linear, the default) with "
                     "--expert-tensor-parallel-size ",
                     etp.size(),
                     " (which defaults to --tensor-model-parallel-size) are not implemented: add "
                     "--expert-tensor-parallel-size 1, or --disable-bias-linear");
      mark_etp(fc1_.back()->bias, etp, 0, cfg.gated_mlp() ? 2 : 1);
      mark_etp(fc2_.back()->bias, etp, -1, 1);
    }
  }
}

void GroupedExperts::collect(std::vector<Param*>& out) {
  for (size_t i = 0; i < fc1_.size(); ++i) {
    fc1_[i]->collect(out);
    fc2_[i]->collect(out);
  }
}

DType GroupedExperts::gemm_dtype() const {
  return fc1_.front()->high_precision_dtype();
}

Tensor GroupedExperts::gemm_input(const Tensor& t) const {
  const DType wt = gemm_dtype();
  return t.dtype() == wt || wt == DType::kF32 ? t : t.to(wt);
}

Tensor GroupedExperts::forward(const Tensor& x, const std::vector<int64_t>& counts,
                               const std::vector<double>& probs, Ctx& ctx) const {
  if (!cfg_.moe.apply_probs_on_input) return forward_rows(x, counts, probs, ctx);
  // --moe-apply-probs-on-input: the rows scaled by their probabilities in f32 (Megatron's
  // product of the fp32 probabilities with the input, cast to the input's dtype by the GEMM
  // input conversion), and the activation's probabilities 1.
  Tensor scaled = x.dtype() == DType::kF64 ? x.clone() : x.to(DType::kF32);
  ops::scale_rows(scaled, row_tensor(probs, scaled.dtype()));
  Tensor y = forward_rows(scaled, counts, std::vector<double>(probs.size(), 1.0), ctx);
  ctx.unscaled_x = x;
  ctx.input_probs = probs;
  return y;
}

Tensor GroupedExperts::backward(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const {
  if (!ctx.unscaled_x.defined()) return backward_rows(dy, ctx, dprobs);
  // y = f(p x): dp_r = <df_r, x_r>, dx = p df (f's gradient for its probabilities of 1 unused).
  const Tensor x = ctx.unscaled_x;
  const std::vector<double> probs = ctx.input_probs;
  std::vector<double> unused;
  Tensor dx = backward_rows(dy, ctx, &unused);
  const int64_t N = dx.dim(0);
  Tensor dp = Tensor::empty({N}, dx.dtype());
  ops::row_dots(dp, dx, x.dtype() == dx.dtype() ? x : x.to(dx.dtype()));
  const Tensor dp64 = dp.to(DType::kF64);
  dprobs->assign(dp64.data<double>(), dp64.data<double>() + N);
  ops::scale_rows(dx, row_tensor(probs, dx.dtype()));
  return dx;
}

Tensor GroupedExperts::forward_rows(const Tensor& x, const std::vector<int64_t>& counts,
                                    const std::vector<double>& probs, Ctx& ctx) const {
  if (fp8_) return forward_fp8(x, counts, probs, ctx);
  const int64_t N = x.dim(0), h = cfg_.hidden_size;
  const int64_t f = ffn_local_, f1 = cfg_.gated_mlp() ? 2 * f : f;
  const DType acc = gemm_dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  ctx.counts = counts;
  ctx.probs = probs;
  ctx.x = gemm_input(x);
  ctx.pre_act = Tensor::empty({N, f1}, acc);
  ops::grouped_matmul(ctx.pre_act, ctx.x, values(fc1_), true, counts);
  if (cfg_.add_bias_linear) add_fc1_bias(ctx.pre_act, fc1_, counts);
  activation(ctx);
  Tensor y = Tensor::empty({N, h}, acc);
  ops::grouped_matmul(y, ctx.scaled, values(fc2_), true, counts);
  if (cfg_.add_bias_linear) add_fc2_bias(y, fc2_, counts, probs);
  // --recompute-modules moe_act: the activation and its scaled copy are rebuilt in backward from
  // pre_act and the probabilities (output-discarding recomputation).
  if (recompute_act_) ctx.act = ctx.scaled = Tensor();
  return y;
}

void GroupedExperts::activation(Ctx& ctx) const {
  const int64_t N = ctx.pre_act.dim(0), f = ffn_local_;
  const DType acc = ctx.pre_act.dtype();
  ctx.act = Tensor::empty({N, f}, acc);
  if (N > 0) mlp_activation_forward(cfg_, ctx.act, ctx.pre_act);
  Tensor scaled = ctx.act.clone();
  ops::scale_rows(scaled, row_tensor(ctx.probs, acc));
  ctx.scaled = gemm_input(scaled);
}

Tensor GroupedExperts::backward_rows(const Tensor& dy, Ctx& ctx,
                                     std::vector<double>* dprobs) const {
  if (fp8_) return backward_fp8(dy, ctx, dprobs);
  if (!ctx.act.defined()) activation(ctx);  // moe_act's recomputation
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
  if (cfg_.add_bias_linear) fc2_bias_backward(dy, fc2_, ctx.counts, ctx.probs, dprobs);
  ops::scale_rows(dscaled, row_tensor(ctx.probs, acc));
  Tensor dpre = Tensor::empty({N, f1}, acc);
  if (N > 0) mlp_activation_backward(cfg_, dpre, dscaled, ctx.pre_act);
  if (cfg_.add_bias_linear) fc1_bias_backward(dpre, fc1_, ctx.counts);
  const Tensor dpre_c = gemm_input(dpre);
  Tensor dx = Tensor::empty({N, cfg_.hidden_size}, acc);
  ops::grouped_matmul(dx, dpre_c, values(fc1_), false, ctx.counts);
  std::vector<Tensor> dw1 = grads(fc1_);
  ops::grouped_matmul_at(dw1, dpre_c, ctx.x, ctx.counts, 1.0f);
  ctx = Ctx{};
  return dx;
}

std::vector<Fp8GemmScaling*> GroupedExperts::enable_fp8(const Fp8Config& cfg) {
  fp8_ = true;
  std::vector<Fp8GemmScaling*> out;
  for (const auto* fc : {&fc1_, &fc2_}) {
    for (const auto& l : *fc) {
      Fp8GemmScaling* g = l->enable_fp8(cfg, etp_rank_, etp_size_);
      g->mark_expert_parallel();
      out.push_back(g);
    }
  }
  return out;
}

namespace {

// Each expert's block of rows of x quantised with that expert's scaling (operand op, for
// `usage`) into one tensor, as the grouped GEMM reads it; the blocks' inverse scales in *inv.
// Block-scaled recipes' column blocks stop at each expert's last row: TE's GroupedLinear pads
// each expert's rows with zeros, which change no block's amax.
Tensor quantize_blocks(const Tensor& x, const std::vector<int64_t>& counts,
                       const std::vector<std::unique_ptr<Linear>>& fc, Fp8GemmScaling::Operand op,
                       std::vector<float>* inv, Fp8Usage usage = Fp8Usage::kRowwise) {
  const int64_t cols = x.dim(1);
  Tensor q =
      Tensor::empty(x.shape(), x.dtype() == DType::kF64 ? DType::kF64 : DType::kBF16, x.device());
  inv->clear();
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    Tensor block = q.flat_view(row * cols, {counts[g], cols});
    inv->push_back(
        fc[g]->fp8()->quantize_into(block, x.flat_view(row * cols, {counts[g], cols}), op, usage));
    row += counts[g];
  }
  return q;
}

// [N] of dtype t: the rows of block g get a[g] * b[g] (a grouped FP8 GEMM's inverse scales).
Tensor block_factors(const std::vector<int64_t>& counts, const std::vector<float>& a,
                     const std::vector<float>& b, DType t) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  Tensor f = Tensor::empty({n}, DType::kF64);
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g)
    for (int64_t i = 0; i < counts[g]; ++i) f.data<double>()[row++] = a[g] * b[g];
  return t == DType::kF64 ? f : f.to(t);
}

std::vector<float> inverses(const std::vector<Fp8Tensor>& w) {
  std::vector<float> out;
  for (const Fp8Tensor& t : w) out.push_back(t.scale_inv);
  return out;
}

std::vector<Tensor> quantised(const std::vector<Fp8Tensor>& w) {
  std::vector<Tensor> out;
  for (const Fp8Tensor& t : w) out.push_back(t.q);
  return out;
}

// main_grad[g] += (a_g^T c_g) a_inv[g] c_inv[g] over the blocks (FP8 weight gradients).
void accumulate_fp8_wgrad(const std::vector<std::unique_ptr<Linear>>& fc, const Tensor& a,
                          const std::vector<float>& a_inv, const Tensor& c,
                          const std::vector<float>& c_inv, const std::vector<int64_t>& counts) {
  std::vector<Tensor> partial;
  for (const auto& l : fc) {
    const Tensor& g = l->weight.main_grad;
    partial.push_back(Tensor::empty(g.shape(), g.dtype(), g.device()));
  }
  ops::grouped_matmul_at(partial, a, c, counts, 0.0f);
  for (size_t g = 0; g < fc.size(); ++g) {
    ops::scale_inplace(partial[g], static_cast<double>(a_inv[g] * c_inv[g]));
    Tensor dw = fc[g]->weight.main_grad;
    ops::add_inplace(dw, partial[g]);
  }
}

}  // namespace

Tensor GroupedExperts::forward_fp8(const Tensor& x, const std::vector<int64_t>& counts,
                                   const std::vector<double>& probs, Ctx& ctx) const {
  const int64_t N = x.dim(0), h = cfg_.hidden_size;
  const int64_t f = ffn_local_, f1 = cfg_.gated_mlp() ? 2 * f : f;
  const DType acc = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const bool wgrad = fc1_.front()->fp8()->config().wgrad;
  ctx.counts = counts;
  ctx.probs = probs;
  const Fp8GemmScaling& scaling = *fc1_.front()->fp8();
  // Block-scaled recipes: the weight gradients read their inputs quantised columnwise, kept
  // instead of the forward's rowwise ones (only when a backward follows).
  const bool two_usages = scaling.usages_differ();
  const bool keep_columnwise = two_usages && wgrad && scaling.backward_follows();
  // A GEMM input quantised for the forward (returned, its inverse scales in *inv) and kept for
  // the weight gradient in *kept (the same tensor, or its columnwise quantisation).
  auto quantize_input = [&](const Tensor& t, const std::vector<std::unique_ptr<Linear>>& fc,
                            std::vector<float>* inv, Tensor* kept, std::vector<float>* kept_inv) {
    Tensor t8 = quantize_blocks(t, counts, fc, Fp8GemmScaling::kInput, inv);
    if (!two_usages) {
      *kept = t8;
      *kept_inv = *inv;
    } else if (keep_columnwise) {
      *kept =
          quantize_blocks(t, counts, fc, Fp8GemmScaling::kInput, kept_inv, Fp8Usage::kColumnwise);
    }
    return t8;
  };
  ctx.w1 = fp8_weights(fc1_);
  ctx.w2 = fp8_weights(fc2_);
  std::vector<float> x_inv;
  const Tensor x8 = quantize_input(x, fc1_, &x_inv, &ctx.x8, &ctx.x_inv);
  if (!wgrad) ctx.x = gemm_input(x);
  ctx.pre_act = Tensor::empty({N, f1}, acc);
  ops::grouped_matmul(ctx.pre_act, x8, quantised(ctx.w1), true, counts);
  ops::scale_rows(ctx.pre_act, block_factors(counts, x_inv, inverses(ctx.w1), acc));
  if (cfg_.add_bias_linear) add_fc1_bias(ctx.pre_act, fc1_, counts);
  ctx.act = Tensor::empty({N, f}, acc);
  if (N > 0) mlp_activation_forward(cfg_, ctx.act, ctx.pre_act);
  Tensor scaled = ctx.act.clone();
  ops::scale_rows(scaled, row_tensor(probs, acc));
  std::vector<float> scaled_inv;
  const Tensor scaled8 = quantize_input(scaled, fc2_, &scaled_inv, &ctx.scaled8, &ctx.scaled_inv);
  if (!wgrad) ctx.scaled = gemm_input(scaled);
  Tensor y = Tensor::empty({N, h}, acc);
  ops::grouped_matmul(y, scaled8, quantised(ctx.w2), true, counts);
  ops::scale_rows(y, block_factors(counts, scaled_inv, inverses(ctx.w2), acc));
  if (cfg_.add_bias_linear) add_fc2_bias(y, fc2_, counts, probs);
  // FP8 primary weights are decoded again by the backward: only their codes stay in between;
  // block-scaled recipes' backward reads the weights columnwise.
  if (fc1_.front()->weight.fp8 || two_usages) {
    ctx.w1.clear();
    ctx.w2.clear();
  }
  return y;
}

std::vector<Fp8Tensor> GroupedExperts::fp8_weights(const std::vector<std::unique_ptr<Linear>>& fc,
                                                   Fp8Usage usage) const {
  std::vector<Fp8Tensor> out;
  for (const auto& l : fc) {
    out.push_back(usage == Fp8Usage::kColumnwise ? l->fp8()->weight_columnwise(l->weight)
                                                 : l->fp8()->weight(l->weight));
  }
  return out;
}

Tensor GroupedExperts::backward_fp8(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const {
  const int64_t N = dy.dim(0);
  const int64_t f = ffn_local_, f1 = cfg_.gated_mlp() ? 2 * f : f;
  const DType acc = dy.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const bool wgrad = fc1_.front()->fp8()->config().wgrad;
  std::vector<float> dy_inv, dpre_inv;
  // Block-scaled recipes: the input gradients read the weights columnwise and the weight
  // gradients the output gradients columnwise (quantised once more); per-tensor recipes read one
  // quantisation both ways.
  const bool two_usages = fc1_.front()->fp8()->usages_differ();
  const Fp8Usage dgrad_weights = two_usages ? Fp8Usage::kColumnwise : Fp8Usage::kRowwise;
  if (ctx.w1.empty()) ctx.w1 = fp8_weights(fc1_, dgrad_weights);
  if (ctx.w2.empty()) ctx.w2 = fp8_weights(fc2_, dgrad_weights);
  auto for_wgrad = [&](const Tensor& g, const Tensor& g8,
                       const std::vector<std::unique_ptr<Linear>>& fc, std::vector<float>* inv) {
    return two_usages ? quantize_blocks(g, ctx.counts, fc, Fp8GemmScaling::kGradOutput, inv,
                                        Fp8Usage::kColumnwise)
                      : g8;
  };
  const Tensor dy8 = quantize_blocks(dy, ctx.counts, fc2_, Fp8GemmScaling::kGradOutput, &dy_inv);
  Tensor dscaled = Tensor::empty({N, f}, acc);
  ops::grouped_matmul(dscaled, dy8, quantised(ctx.w2), false, ctx.counts);
  ops::scale_rows(dscaled, block_factors(ctx.counts, dy_inv, inverses(ctx.w2), acc));
  if (wgrad) {
    std::vector<float> dyc_inv = two_usages ? std::vector<float>{} : dy_inv;
    const Tensor dy8c = for_wgrad(dy, dy8, fc2_, &dyc_inv);
    accumulate_fp8_wgrad(fc2_, dy8c, dyc_inv, ctx.scaled8, ctx.scaled_inv, ctx.counts);
  } else {
    std::vector<Tensor> dw2 = grads(fc2_);
    ops::grouped_matmul_at(dw2, gemm_input(dy), ctx.scaled, ctx.counts, 1.0f);
  }
  Tensor dp = Tensor::empty({N}, acc);
  ops::row_dots(dp, dscaled, ctx.act);
  const Tensor dp64 = dp.to(DType::kF64);
  dprobs->assign(dp64.data<double>(), dp64.data<double>() + N);
  if (cfg_.add_bias_linear) fc2_bias_backward(dy, fc2_, ctx.counts, ctx.probs, dprobs);
  ops::scale_rows(dscaled, row_tensor(ctx.probs, acc));
  Tensor dpre = Tensor::empty({N, f1}, acc);
  if (N > 0) mlp_activation_backward(cfg_, dpre, dscaled, ctx.pre_act);
  if (cfg_.add_bias_linear) fc1_bias_backward(dpre, fc1_, ctx.counts);
  const Tensor dpre8 =
      quantize_blocks(dpre, ctx.counts, fc1_, Fp8GemmScaling::kGradOutput, &dpre_inv);
  Tensor dx = Tensor::empty({N, cfg_.hidden_size}, acc);
  ops::grouped_matmul(dx, dpre8, quantised(ctx.w1), false, ctx.counts);
  ops::scale_rows(dx, block_factors(ctx.counts, dpre_inv, inverses(ctx.w1), acc));
  if (wgrad) {
    std::vector<float> dprec_inv = two_usages ? std::vector<float>{} : dpre_inv;
    const Tensor dpre8c = for_wgrad(dpre, dpre8, fc1_, &dprec_inv);
    accumulate_fp8_wgrad(fc1_, dpre8c, dprec_inv, ctx.x8, ctx.x_inv, ctx.counts);
  } else {
    std::vector<Tensor> dw1 = grads(fc1_);
    ops::grouped_matmul_at(dw1, gemm_input(dpre), ctx.x, ctx.counts, 1.0f);
  }
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
