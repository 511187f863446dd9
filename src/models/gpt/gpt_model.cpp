// GPT forward and backward: embeddings (+ positions), decoder, output GEMM against the tied or
// untied weight, fused masked cross-entropy; [b, s] <-> [s, b] transposes at the edges. The
// tensor-parallel variants of the embedding and the loss come from parallel/vocab_parallel.h;
// with one TP rank the single-process kernels run directly.
#include "models/gpt/gpt_model.h"

#include <cstring>

#include "parallel/mappings.h"
#include "parallel/vocab_parallel.h"
#include "tensor/ops.h"

namespace megatron {

Tensor transpose_bs(const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2, "expected a [b, s] tensor, got ", x.str());
  Tensor y = Tensor::empty({x.dim(1), x.dim(0)}, x.dtype());
  ops::transpose_2d(y, x);
  return y;
}

namespace {

// [s, b] -> [b, s] (or back, with the dims swapped) for any dtype.
Tensor swap_sb(const Tensor& x, int64_t rows, int64_t cols) {
  Tensor y = Tensor::empty({cols, rows}, x.dtype());
  ops::transpose_2d(y, x.view({rows, cols}));
  return y;
}

void mark_vocab_shard(Param& p, const TensorParallelContext& tp) {
  p.tp_partition_dim = 0;
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
}

}  // namespace

GPTModel::GPTModel(const TransformerConfig& cfg, GPTStage stage)
    : cfg_(cfg), stage_(std::move(stage)) {
  if (!stage_.tp) stage_.tp = make_self_process_group();
  if (stage_.num_layers < 0) stage_.num_layers = cfg_.num_layers - stage_.first_layer;
  tp_ = TensorParallelContext{stage_.tp.get(), stage_.sequence_parallel};
  const int64_t vocab_local =
      divide(cfg_.padded_vocab_size, tp_.size(),
             "the padded vocabulary by --tensor-model-parallel-size (pad it with "
             "--make-vocab-size-divisible-by)");
  vocab_start_ = tp_.rank() * vocab_local;
  const bool tied = !cfg_.untie_embeddings_and_output_weights;
  if (stage_.pre_process || (stage_.post_process && tied)) {
    word_embeddings.name = "embedding.word_embeddings.weight";
    word_embeddings.shape = {vocab_local, cfg_.hidden_size};
    word_embeddings.init_std = cfg_.init_method_std;
    word_embeddings.is_embedding_or_output = true;
    word_embeddings.shared_embedding = !stage_.pre_process;
    mark_vocab_shard(word_embeddings, tp_);
  }
  if (stage_.pre_process && cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    position_embeddings.name = "embedding.position_embeddings.weight";
    position_embeddings.shape = {cfg_.max_position_embeddings, cfg_.hidden_size};
    position_embeddings.init_std = cfg_.init_method_std;
  }
  decoder = std::make_unique<TransformerBlock>("decoder", cfg_, tp_, stage_.first_layer,
                                               stage_.num_layers, stage_.post_process);
  if (stage_.post_process && !tied) {
    output_layer.name = "output_layer.weight";
    output_layer.shape = {vocab_local, cfg_.hidden_size};
    output_layer.init_std = cfg_.init_method_std;
    output_layer.is_embedding_or_output = true;
    mark_vocab_shard(output_layer, tp_);
  }
  // Every parameter knows its TP coordinates, replicated ones too: the gradient norm counts a
  // replicated parameter on TP rank 0 only.
  for (Param* p : parameters()) {
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
}

std::vector<Param*> GPTModel::parameters() {
  std::vector<Param*> out;
  if (!word_embeddings.name.empty()) out.push_back(&word_embeddings);
  if (!position_embeddings.name.empty()) out.push_back(&position_embeddings);
  decoder->collect(out);
  if (!output_layer.name.empty()) out.push_back(&output_layer);
  return out;
}

const Param& GPTModel::output_weight() const {
  return cfg_.untie_embeddings_and_output_weights ? output_layer : word_embeddings;
}

Shape GPTModel::activation_shape(int64_t micro_batch_size) const {
  const int64_t s = cfg_.seq_length / (tp_.sp() ? tp_.size() : 1);
  return Shape{s, micro_batch_size, cfg_.hidden_size};
}

namespace {
// Rows of `table` gathered for `ids`, returned in `act` dtype (bf16 tables are widened).
Tensor gather(const Tensor& ids, const Tensor& table, DType act) {
  Tensor rows = Tensor::empty({ids.numel(), table.dim(1)}, table.dtype());
  ops::embedding_forward(rows, ids, table);
  return rows.dtype() == act ? rows : rows.to(act);
}
}  // namespace

Tensor GPTModel::embed(const GPTInputs& in, Ctx& ctx, const ForwardMode& mode) const {
  const Tensor& tokens = in.tokens;
  MEGATRON_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::kI64,
                 "GPTModel: tokens must be [b, s] i64, got ", tokens.str());
  MEGATRON_CHECK(ctx.s <= cfg_.max_position_embeddings ||
                     cfg_.position_embedding != PositionEmbedding::kLearnedAbsolute,
                 "sequence of length ", ctx.s, " exceeds --max-position-embeddings (",
                 cfg_.max_position_embeddings, ")");
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size;
  const DType act = word_embeddings.value.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;

  ctx.ids = transpose_bs(tokens);
  if (in.positions.defined()) {
    ctx.positions = transpose_bs(in.positions);
  } else {
    ctx.positions = Tensor::empty({s, b}, DType::kI64);
    int64_t* p = ctx.positions.data<int64_t>();
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < b; ++i) p[t * b + i] = t;
  }

  Tensor x;
  if (tp_.size() == 1) {
    x = gather(ctx.ids, word_embeddings.value, act);
  } else {
    x = Tensor::empty({s * b, h}, act);
    vocab_parallel_embedding_forward(x, ctx.ids, word_embeddings.value, vocab_start_, *tp_.group);
  }
  if (cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    ops::add_inplace(x, gather(ctx.positions, position_embeddings.value, act));
  }
  // Dropout on the whole [s, b, h] embedding (every TP rank holds it), then, under sequence
  // parallelism, each rank keeps its s/tp positions: the mask is the single-process one.
  ctx.emb_dropout = mode.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f;
  ctx.seed = mode.seed;
  ctx.emb_stream = mode.site_stream(-1, 0);
  if (ctx.emb_dropout > 0) ops::dropout_forward(x, x, ctx.emb_dropout, ctx.seed, ctx.emb_stream);
  x = x.view({s, b, h});
  return tp_.sp() ? scatter_to_sequence_parallel_region_forward(x, *tp_.group) : x;
}

void GPTModel::embed_backward(Tensor dx, Ctx& ctx) const {
  const int64_t n = ctx.s * ctx.b, h = cfg_.hidden_size;
  if (tp_.sp()) dx = scatter_to_sequence_parallel_region_backward(dx, *tp_.group);
  dx = dx.view({n, h});
  if (ctx.emb_dropout > 0) ops::dropout_backward(dx, dx, ctx.emb_dropout, ctx.seed, ctx.emb_stream);
  Tensor dwe = word_embeddings.main_grad;
  if (tp_.size() == 1) {
    ops::embedding_backward(dwe, dx, ctx.ids);
  } else {
    vocab_parallel_embedding_backward(dwe, dx, ctx.ids, vocab_start_);
  }
  if (cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    Tensor dpe = position_embeddings.main_grad;
    ops::embedding_backward(dpe, dx, ctx.positions);
  }
}

Tensor GPTModel::logits_of(const Tensor& hidden, Ctx& ctx) const {
  // Output layer: logits = hidden @ W^T, W = word embeddings (tied) or output_layer, this rank's
  // vocabulary rows. The GEMM needs every position: under sequence parallelism they are gathered
  // (backward: reduce-scatter), else the hidden state enters the TP region (backward: all-reduce
  // of the partial input gradients), Megatron's parallel_lm_logits.
  const int64_t n = ctx.s * ctx.b, h = cfg_.hidden_size;
  Tensor full = tp_.sp() ? gather_from_sequence_parallel_region_forward(hidden, *tp_.group)
                         : copy_to_tp_region_forward(hidden, *tp_.group);
  const Tensor& w = output_weight().value;
  ctx.hidden = is_half(w.dtype()) ? full.to(w.dtype()) : full;
  ctx.hidden = ctx.hidden.view({n, h});
  const DType act = w.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  ctx.logits = Tensor::empty({n, w.dim(0)}, act);
  ops::matmul(ctx.logits, ctx.hidden, false, w, true);
  return ctx.logits;
}

Tensor GPTModel::output_and_loss(const Tensor& hidden, const GPTInputs& in, Ctx& ctx) const {
  logits_of(hidden, ctx);
  check_shape(in.labels, {ctx.b, ctx.s}, "GPTModel labels");
  const int64_t n = ctx.s * ctx.b;
  ctx.targets = transpose_bs(in.labels).view({n});
  Tensor loss_sb = Tensor::empty({n}, ctx.logits.dtype());
  ctx.lse = Tensor::empty({n}, ctx.logits.dtype());
  if (tp_.size() == 1) {
    ops::cross_entropy_forward(loss_sb, ctx.lse, ctx.logits, ctx.targets, cfg_.vocab_size);
  } else {
    vocab_parallel_cross_entropy_forward(loss_sb, ctx.lse, ctx.logits, ctx.targets, vocab_start_,
                                         cfg_.vocab_size, *tp_.group);
  }
  return swap_sb(loss_sb, ctx.s, ctx.b);  // [s, b] -> [b, s]
}

Tensor GPTModel::output_and_loss_backward(const Tensor& dloss, Ctx& ctx) const {
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size, n = s * b;
  check_shape(dloss, {b, s}, "GPTModel::backward dloss");
  Tensor d = dloss.dtype() == ctx.logits.dtype() ? dloss : dloss.to(ctx.logits.dtype());
  Tensor dloss_sb = swap_sb(d, b, s).view({n});
  // dlogits overwrite the logits: no second [n, Vp] buffer.
  Tensor dlogits = ctx.logits;
  if (tp_.size() == 1) {
    ops::cross_entropy_backward(dlogits, dloss_sb, ctx.logits, ctx.lse, ctx.targets,
                                cfg_.vocab_size);
  } else {
    vocab_parallel_cross_entropy_backward(dlogits, dloss_sb, ctx.logits, ctx.lse, ctx.targets,
                                          vocab_start_, cfg_.vocab_size);
  }
  const Param& w = output_weight();
  Tensor dl = is_half(w.value.dtype()) ? dlogits.to(w.value.dtype()) : dlogits;
  ctx.logits = Tensor();
  dlogits = Tensor();
  Tensor dhidden = Tensor::empty({n, h}, ctx.lse.dtype());
  ops::matmul(dhidden, dl, false, w.value, false);
  Tensor dw = w.main_grad;
  ops::matmul(dw, dl, true, ctx.hidden, false, 1.0f);
  dl = Tensor();
  dhidden = dhidden.view({s, b, h});
  return tp_.sp() ? gather_from_sequence_parallel_region_backward(dhidden, *tp_.group)
                  : copy_to_tp_region_backward(dhidden, *tp_.group);
}

Tensor GPTModel::forward_stage(const Tensor& hidden_in, const GPTInputs& in, Ctx& ctx,
                               const ForwardMode& mode) const {
  if (stage_.pre_process) {
    MEGATRON_CHECK(in.tokens.defined() && in.tokens.ndim() == 2,
                   "GPTModel: the first stage needs [b, s] tokens");
    ctx.b = in.tokens.dim(0);
    ctx.s = in.tokens.dim(1);
  } else {
    MEGATRON_CHECK(hidden_in.defined() && hidden_in.ndim() == 3,
                   "GPTModel: a later pipeline stage needs the previous stage's [s, b, h] output");
    ctx.s = hidden_in.dim(0) * (tp_.sp() ? tp_.size() : 1);
    ctx.b = hidden_in.dim(1);
  }
  Tensor x = stage_.pre_process ? embed(in, ctx, mode) : hidden_in;
  // RoPE always rotates by the position in the sequence, 0..s-1: Megatron-core computes the
  // rotary embedding from the sequence length and ignores --reset-position-ids for it (those
  // reset the learned absolute embeddings only). Attention across documents is governed by
  // doc_start (--reset-attention-mask) instead.
  TokenLayout layout;
  layout.doc_start = in.doc_start;
  Tensor hidden = decoder->forward(x, layout, ctx.decoder, mode);
  return stage_.post_process ? output_and_loss(hidden, in, ctx) : hidden;
}

void GPTModel::report(const ParamsDone& done, std::initializer_list<const Param*> ps) const {
  if (!done) return;
  std::vector<const Param*> out;
  for (const Param* p : ps)
    if (!p->name.empty()) out.push_back(p);
  if (!out.empty()) done(out);
}

Tensor GPTModel::backward_stage(const Tensor& d, Ctx& ctx, const ParamsDone& done) const {
  Tensor dh = d;
  if (stage_.post_process) {
    dh = output_and_loss_backward(d, ctx);
    // The output weight is final here unless it is the word embedding of this same stage.
    if (!(stage_.pre_process && &output_weight() == &word_embeddings)) {
      report(done, {&output_weight()});
    }
  }
  Tensor dx = decoder->backward(dh, ctx.decoder, done);
  if (stage_.pre_process) {
    embed_backward(dx, ctx);
    report(done, {&word_embeddings, &position_embeddings});
    dx = Tensor();
  }
  ctx = Ctx{};
  return dx;
}

Tensor GPTModel::forward(const Tensor& tokens, const Tensor& labels, const Tensor& positions,
                         Ctx& ctx, const ForwardMode& mode, const Tensor& doc_start) const {
  MEGATRON_ASSERT(stage_.pre_process && stage_.post_process, "forward() runs the whole model");
  return forward_stage(Tensor(), GPTInputs{tokens, labels, positions, doc_start}, ctx, mode);
}

void GPTModel::backward(const Tensor& dloss, Ctx& ctx) const {
  backward_stage(dloss, ctx);
}

Tensor GPTModel::forward_logits(const Tensor& tokens, const Tensor& positions, Ctx& ctx,
                                const ForwardMode& mode, const Tensor& doc_start) const {
  MEGATRON_CHECK(stage_.pre_process && stage_.post_process && tp_.size() == 1,
                 "logits of the whole vocabulary need the whole model in one process");
  MEGATRON_CHECK(tokens.ndim() == 2, "GPTModel: tokens must be [b, s] i64, got ", tokens.str());
  ctx.b = tokens.dim(0);
  ctx.s = tokens.dim(1);
  GPTInputs in{tokens, Tensor(), positions, doc_start};
  TokenLayout layout;
  layout.doc_start = doc_start;
  Tensor hidden = decoder->forward(embed(in, ctx, mode), layout, ctx.decoder, mode);
  return logits_of(hidden, ctx);
}

}  // namespace megatron
