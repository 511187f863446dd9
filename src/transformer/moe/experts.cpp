// GroupedExperts: per-expert GEMMs over contiguous row blocks, one activation pass over all rows.
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

// Rows [begin, begin + n) of a [N, c] tensor.
Tensor rows(const Tensor& t, int64_t begin, int64_t n) {
  return t.slice0(begin, begin + n);
}

// probs [N] as a tensor of dtype t (f32 in training: Megatron multiplies in the probs' f32).
Tensor row_tensor(const std::vector<double>& v, DType t) {
  Tensor d = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF64);
  std::copy(v.begin(), v.end(), d.data<double>());
  return t == DType::kF64 ? d : d.to(t);
}

// fn(e, first row, rows) for every local expert with rows, in order.
template <typename Fn>
void for_each_block(const std::vector<int64_t>& counts, Fn&& fn) {
  int64_t at = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) fn(e, at, counts[e]);
    at += counts[e];
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
  ffn_local_ = divide(m.ffn_hidden_size, etp.size(),
                      "--moe-ffn-hidden-size by --expert-tensor-parallel-size");
  const int64_t h = cfg.hidden_size, f1 = cfg.swiglu ? 2 * ffn_local_ : ffn_local_;
  const double out_std = cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  for (int64_t i = 0; i < local; ++i) {
    const std::string p = name + ".local_experts." + std::to_string(first_ + i);
    fc1_.push_back(std::make_unique<Linear>(p + ".linear_fc1", h, f1, false, cfg.init_method_std));
    fc2_.push_back(std::make_unique<Linear>(p + ".linear_fc2", ffn_local_, h, false, out_std));
    mark_etp(fc1_.back()->weight, etp, 0, cfg.swiglu ? 2 : 1);
    mark_etp(fc2_.back()->weight, etp, 1, 1);
  }
}

void GroupedExperts::collect(std::vector<Param*>& out) {
  for (size_t i = 0; i < fc1_.size(); ++i) {
    fc1_[i]->collect(out);
    fc2_[i]->collect(out);
  }
}

namespace {

// Rows per expert rounded up to a multiple of kRowBlock (0 stays 0).
constexpr int64_t kRowBlock = 32;
std::vector<int64_t> padded(const std::vector<int64_t>& counts) {
  std::vector<int64_t> out(counts);
  for (int64_t& n : out) n = (n + kRowBlock - 1) / kRowBlock * kRowBlock;
  return out;
}

// The row blocks of `x` (counts[e] rows each) at their padded places (zero rows between), or
// back: padded -> compact.
Tensor repack(const Tensor& x, const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  int64_t total = 0;
  for (int64_t n : to) total += n;
  Tensor out = Tensor::zeros({total, x.dim(-1)}, x.dtype());
  int64_t a = 0, b = 0;
  for (size_t e = 0; e < from.size(); ++e) {
    const int64_t n = std::min(from[e], to[e]);
    if (n > 0) out.slice0(b, b + n).copy_from(x.slice0(a, a + n));
    a += from[e];
    b += to[e];
  }
  return out;
}

}  // namespace

Tensor GroupedExperts::forward(const Tensor& x, const std::vector<int64_t>& counts,
                               const std::vector<double>& probs, Ctx& ctx) const {
  // Each expert's block padded with zero rows to a multiple of 32: oneDNN's bf16 (AMX) GEMMs
  // run up to 6x slower for other row counts (measured, [M, 256] x [256, 1024] on 2 cores:
  // M 530 at 319 GFLOP/s, 464 at 714, 496 at 712; 480 at 2171, 512 at 2346). Zero rows give
  // zero activations and add nothing to any gradient. Fewer distinct GEMM shapes also keep the
  // primitive cache small as routing changes step to step.
  ctx.compact_counts = counts;
  const std::vector<int64_t> pc = padded(counts);
  if (pc == counts) return forward_blocks(x, counts, probs, ctx);
  std::vector<double> pp;
  for (size_t e = 0, at = 0; e < counts.size(); ++e) {
    pp.insert(pp.end(), probs.begin() + static_cast<int64_t>(at),
              probs.begin() + static_cast<int64_t>(at + counts[e]));
    pp.resize(pp.size() + static_cast<size_t>(pc[e] - counts[e]), 0.0);
    at += static_cast<size_t>(counts[e]);
  }
  return repack(forward_blocks(repack(x, counts, pc), pc, pp, ctx), pc, counts);
}

Tensor GroupedExperts::backward(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const {
  const std::vector<int64_t> counts = ctx.compact_counts, pc = ctx.counts;
  if (pc == counts) return backward_blocks(dy, ctx, dprobs);
  std::vector<double> dpp;
  Tensor dx = repack(backward_blocks(repack(dy, counts, pc), ctx, &dpp), pc, counts);
  dprobs->clear();
  for (size_t e = 0, at = 0; e < counts.size(); ++e) {
    dprobs->insert(dprobs->end(), dpp.begin() + static_cast<int64_t>(at),
                   dpp.begin() + static_cast<int64_t>(at + counts[e]));
    at += static_cast<size_t>(pc[e]);
  }
  return dx;
}

Tensor GroupedExperts::forward_blocks(const Tensor& x, const std::vector<int64_t>& counts,
                                      const std::vector<double>& probs, Ctx& ctx) const {
  const int64_t N = x.dim(0), h = cfg_.hidden_size;
  const int64_t f = ffn_local_, f1 = cfg_.swiglu ? 2 * f : f;
  const DType wt = fc1_.front()->weight.value.dtype();
  const DType acc = wt == DType::kF64 ? DType::kF64 : DType::kF32;
  ctx.counts = counts;
  ctx.probs = probs;
  ctx.x = x.dtype() == wt || wt == DType::kF32 ? x : x.to(wt);
  ctx.pre_act = Tensor::empty({N, f1}, acc);
  for_each_block(counts, [&](size_t e, int64_t at, int64_t n) {
    Tensor out = rows(ctx.pre_act, at, n);
    ops::matmul(out, rows(ctx.x, at, n), false, fc1_[e]->weight.value, true);
  });
  ctx.act = Tensor::empty({N, f}, acc);
  if (N > 0) mlp_activation_forward(cfg_, ctx.act, ctx.pre_act);
  Tensor scaled = ctx.act.clone();
  ops::scale_rows(scaled, row_tensor(probs, acc));
  ctx.scaled = scaled.dtype() == wt || wt == DType::kF32 ? scaled : scaled.to(wt);
  Tensor y = Tensor::empty({N, h}, acc);
  for_each_block(counts, [&](size_t e, int64_t at, int64_t n) {
    Tensor out = rows(y, at, n);
    ops::matmul(out, rows(ctx.scaled, at, n), false, fc2_[e]->weight.value, true);
  });
  return y;
}

Tensor GroupedExperts::backward_blocks(const Tensor& dy, Ctx& ctx,
                                       std::vector<double>* dprobs) const {
  const int64_t N = dy.dim(0), h = cfg_.hidden_size;
  const int64_t f = ffn_local_, f1 = cfg_.swiglu ? 2 * f : f;
  const DType wt = fc1_.front()->weight.value.dtype();
  const DType acc = wt == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor dy_c = is_half(wt) ? dy.to(wt) : dy;
  // d(scaled) = dy fc2_e; dW2_e += dy^T scaled.
  Tensor dscaled = Tensor::empty({N, f}, acc);
  for_each_block(ctx.counts, [&](size_t e, int64_t at, int64_t n) {
    Tensor out = rows(dscaled, at, n);
    const Tensor d = rows(dy_c, at, n);
    ops::matmul(out, d, false, fc2_[e]->weight.value, false);
    Tensor dw = fc2_[e]->weight.main_grad;
    ops::matmul(dw, d, true, rows(ctx.scaled, at, n), false, 1.0f);
  });
  // scaled = act * p: dp_r = <dscaled_r, act_r>, dact = dscaled * p.
  Tensor dp = Tensor::empty({N}, acc);
  ops::row_dots(dp, dscaled, ctx.act);
  const Tensor dp64 = dp.to(DType::kF64);
  dprobs->assign(dp64.data<double>(), dp64.data<double>() + N);
  ops::scale_rows(dscaled, row_tensor(ctx.probs, acc));
  Tensor dpre = Tensor::empty({N, f1}, acc);
  if (N > 0) mlp_activation_backward(cfg_, dpre, dscaled, ctx.pre_act);
  const Tensor dpre_c = is_half(wt) ? dpre.to(wt) : dpre;
  Tensor dx = Tensor::empty({N, h}, acc);
  for_each_block(ctx.counts, [&](size_t e, int64_t at, int64_t n) {
    Tensor out = rows(dx, at, n);
    const Tensor d = rows(dpre_c, at, n);
    ops::matmul(out, d, false, fc1_[e]->weight.value, false);
    Tensor dw = fc1_[e]->weight.main_grad;
    ops::matmul(dw, d, true, rows(ctx.x, at, n), false, 1.0f);
  });
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
