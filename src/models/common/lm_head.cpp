// LMHead forward and backward: the output GEMM and the fused masked cross entropy; [b, s] <->
// [s, b] transposes at the loss. With one TP rank the single-process cross entropy runs, else
// the vocab-parallel one (parallel/vocab_parallel.h: max and sums all-reduced over the group).
#include "models/common/lm_head.h"

#include "models/common/language_embedding.h"
#include "parallel/mappings.h"
#include "parallel/vocab_parallel.h"
#include "tensor/ops.h"

namespace megatron {

namespace {
// [rows, cols] -> [cols, rows] for any dtype.
Tensor swap(const Tensor& x, int64_t rows, int64_t cols) {
  Tensor y = Tensor::empty({cols, rows}, x.dtype(), x.device());
  ops::transpose_2d(y, x.view({rows, cols}));
  return y;
}
}  // namespace

LMHead::LMHead(const TransformerConfig& cfg, const TensorParallelContext& tp,
               const Param* word_embeddings, bool output_bias, const std::string& prefix)
    : cfg_(cfg), tp_(tp), vocab_(vocab_shard(cfg, tp)), word_embeddings_(nullptr) {
  if (output_bias) {
    bias.name = prefix + "output_layer.bias";
    bias.shape = {vocab_.rows};
    bias.init = Init::kZeros;
    bias.no_weight_decay = true;
    bias.tp_partition_dim = 0;
    bias.tp_rank = tp_.rank();
    bias.tp_size = tp_.size();
  }
  if (cfg_.untie_embeddings_and_output_weights) {
    make_vocab_table(own_weight, prefix + "output_layer.weight", cfg_, tp_);
  } else if (word_embeddings) {
    word_embeddings_ = word_embeddings;
  } else {
    make_vocab_table(own_weight, "embedding.word_embeddings.weight", cfg_, tp_);
    own_weight.shared_embedding = true;
  }
}

Tensor LMHead::logits(const Tensor& hidden, Ctx& ctx) const {
  MEGATRON_CHECK(hidden.ndim() == 3 && hidden.dim(2) == cfg_.hidden_size,
                 "LMHead: hidden must be [s, b, h], got ", hidden.str());
  ctx.s = hidden.dim(0) * (tp_.sp() ? tp_.size() : 1);
  ctx.b = hidden.dim(1);
  const int64_t n = ctx.s * ctx.b, h = cfg_.hidden_size;
  // The backward of the gather is a reduce-scatter, of the copy an all-reduce of the partial
  // input gradients: every TP rank's GEMM sees the whole hidden state.
  Tensor full = tp_.sp() ? gather_from_sequence_parallel_region_forward(hidden, *tp_.group)
                         : copy_to_tp_region_forward(hidden, *tp_.group);
  const Tensor& w = weight().value;
  ctx.hidden = is_half(w.dtype()) ? full.to(w.dtype()) : full;
  ctx.hidden = ctx.hidden.view({n, h});
  const DType act = w.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  ctx.logits = Tensor::empty({n, w.dim(0)}, act, w.device());
  ops::matmul(ctx.logits, ctx.hidden, false, w, true);
  if (!bias.name.empty()) ops::bias_add(ctx.logits, bias.value_as(act));
  // --use-mup's output multiplier (Megatron core 0.19's _scale_logits), before the loss and in
  // generation alike.
  if (scales_logits()) ops::scale_inplace(ctx.logits, cfg_.mup.output_mult);
  return ctx.logits;
}

Tensor LMHead::gathered_logits(const Tensor& hidden) const {
  MEGATRON_CHECK(!tp_.sp(), "LMHead: gathered logits need the whole sequence on every TP rank");
  Ctx ctx;
  Tensor local = logits(hidden, ctx);
  if (tp_.size() == 1) return local;
  const int64_t n = local.dim(0), cols = local.dim(1), tp = tp_.size();
  Tensor all = Tensor::empty({tp * n, cols}, local.dtype(), local.device());
  tp_.group->all_gather(all, local);  // rank r's [n, Vp/tp] block after rank r - 1's
  std::vector<Tensor> parts;
  for (int64_t r = 0; r < tp; ++r) parts.push_back(all.slice0(r * n, (r + 1) * n));
  Tensor out = Tensor::empty({n, tp * cols}, local.dtype(), local.device());
  ops::concat_last_dim(out, parts);
  return out;
}

Tensor LMHead::loss(const Tensor& hidden, const Tensor& labels, Ctx& ctx) const {
  logits(hidden, ctx);
  check_shape(labels, {ctx.b, ctx.s}, "LMHead labels");
  const int64_t n = ctx.s * ctx.b;
  ctx.targets = transpose_bs(labels).view({n});
  Tensor loss_sb = Tensor::empty({n}, ctx.logits.dtype(), ctx.logits.device());
  ctx.lse = Tensor::empty({n}, ctx.logits.dtype(), ctx.logits.device());
  if (tp_.size() == 1) {
    ops::cross_entropy_forward(loss_sb, ctx.lse, ctx.logits, ctx.targets, cfg_.vocab_size);
  } else {
    vocab_parallel_cross_entropy_forward(loss_sb, ctx.lse, ctx.logits, ctx.targets, vocab_.start,
                                         cfg_.vocab_size, *tp_.group);
  }
  return swap(loss_sb, ctx.s, ctx.b);  // [s, b] -> [b, s]
}

Tensor LMHead::loss_backward(const Tensor& dloss, Ctx& ctx, bool weight_grad) const {
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size, n = s * b;
  check_shape(dloss, {b, s}, "LMHead dloss");
  Tensor d = dloss.dtype() == ctx.logits.dtype() ? dloss : dloss.to(ctx.logits.dtype());
  Tensor dloss_sb = swap(d, b, s).view({n});
  // --use-mup's logit multiplier c: the cross entropy's backward is linear in dloss, so scaling
  // the [n] loss gradient gives c times the logits' gradient without a pass over [n, Vp].
  if (scales_logits()) ops::scale_inplace(dloss_sb, cfg_.mup.output_mult);
  // dlogits overwrite the logits: no second [n, Vp] buffer; with 16-bit weights and no output
  // bias (which sums the f32 gradient) the loss writes the GEMMs' rounded input directly.
  const Param& w = weight();
  const bool rounded = is_half(w.value.dtype()) && (bias.name.empty() || !bias.main_grad.defined());
  Tensor dlogits = rounded ? Tensor::empty(ctx.logits.shape(), w.value.dtype(), ctx.logits.device())
                           : ctx.logits;
  if (tp_.size() == 1) {
    ops::cross_entropy_backward(dlogits, dloss_sb, ctx.logits, ctx.lse, ctx.targets,
                                cfg_.vocab_size);
  } else {
    vocab_parallel_cross_entropy_backward(dlogits, dloss_sb, ctx.logits, ctx.lse, ctx.targets,
                                          vocab_.start, cfg_.vocab_size);
  }
  if (weight_grad && !bias.name.empty() && bias.main_grad.defined()) {
    Tensor db = bias.main_grad;
    ops::bias_backward(db, dlogits);
  }
  Tensor dl = is_half(w.value.dtype()) && !rounded ? dlogits.to(w.value.dtype()) : dlogits;
  ctx.logits = Tensor();
  dlogits = Tensor();
  Tensor dhidden = Tensor::empty({n, h}, ctx.lse.dtype(), ctx.lse.device());
  ops::matmul(dhidden, dl, false, w.value, false);
  Tensor dw = w.main_grad;  // undefined: frozen, no weight gradient (Param::requires_grad)
  if (weight_grad && dw.defined()) ops::matmul(dw, dl, true, ctx.hidden, false, w.grad_beta());
  dl = Tensor();
  dhidden = dhidden.view({s, b, h});
  Tensor dx = tp_.sp() ? gather_from_sequence_parallel_region_backward(dhidden, *tp_.group)
                       : copy_to_tp_region_backward(dhidden, *tp_.group);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
