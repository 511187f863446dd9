// GPT forward and backward: embeddings (+ positions), decoder, output GEMM against the tied or
// untied weight, fused masked cross-entropy; [b, s] <-> [s, b] transposes at the edges.
#include "models/gpt_model.h"

#include <cstring>

#include "tensor/ops.h"

namespace megatron {

Tensor transpose_bs(const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2, "expected a [b, s] tensor, got ", x.str());
  const int64_t b = x.dim(0), s = x.dim(1);
  Tensor y = Tensor::empty({s, b}, x.dtype());
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(y.raw());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s; ++t) std::memcpy(dst + (t * b + i) * es, src + (i * s + t) * es, es);
  return y;
}

GPTModel::GPTModel(const TransformerConfig& cfg) : cfg_(cfg) {
  word_embeddings.name = "embedding.word_embeddings.weight";
  word_embeddings.shape = {cfg_.padded_vocab_size, cfg_.hidden_size};
  word_embeddings.init_std = cfg_.init_method_std;
  word_embeddings.is_embedding_or_output = true;
  if (cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    position_embeddings.name = "embedding.position_embeddings.weight";
    position_embeddings.shape = {cfg_.max_position_embeddings, cfg_.hidden_size};
    position_embeddings.init_std = cfg_.init_method_std;
  }
  decoder = std::make_unique<TransformerBlock>("decoder", cfg_);
  if (cfg_.untie_embeddings_and_output_weights) {
    output_layer.name = "output_layer.weight";
    output_layer.shape = {cfg_.padded_vocab_size, cfg_.hidden_size};
    output_layer.init_std = cfg_.init_method_std;
    output_layer.is_embedding_or_output = true;
  }
}

std::vector<Param*> GPTModel::parameters() {
  std::vector<Param*> out{&word_embeddings};
  if (!position_embeddings.name.empty()) out.push_back(&position_embeddings);
  decoder->collect(out);
  if (!output_layer.name.empty()) out.push_back(&output_layer);
  return out;
}

const Param& GPTModel::output_weight() const {
  return cfg_.untie_embeddings_and_output_weights ? output_layer : word_embeddings;
}

namespace {
// Rows of `table` gathered for `ids`, returned in `act` dtype (bf16 tables are widened).
Tensor gather(const Tensor& ids, const Tensor& table, DType act) {
  Tensor rows = Tensor::empty({ids.numel(), table.dim(1)}, table.dtype());
  ops::embedding_forward(rows, ids, table);
  return rows.dtype() == act ? rows : rows.to(act);
}
}  // namespace

Tensor GPTModel::forward_logits(const Tensor& tokens, const Tensor& positions, Ctx& ctx,
                                const ForwardMode& mode, const Tensor& doc_start) const {
  MEGATRON_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::kI64,
                 "GPTModel: tokens must be [b, s] i64, got ", tokens.str());
  ctx.b = tokens.dim(0);
  ctx.s = tokens.dim(1);
  MEGATRON_CHECK(ctx.s <= cfg_.max_position_embeddings ||
                     cfg_.position_embedding != PositionEmbedding::kLearnedAbsolute,
                 "sequence of length ", ctx.s, " exceeds --max-position-embeddings (",
                 cfg_.max_position_embeddings, ")");
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size;
  const DType act = word_embeddings.value.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;

  ctx.ids = transpose_bs(tokens);
  if (positions.defined()) {
    ctx.positions = transpose_bs(positions);
  } else {
    ctx.positions = Tensor::empty({s, b}, DType::kI64);
    int64_t* p = ctx.positions.data<int64_t>();
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < b; ++i) p[t * b + i] = t;
  }

  Tensor x = gather(ctx.ids, word_embeddings.value, act);
  if (cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    ops::add_inplace(x, gather(ctx.positions, position_embeddings.value, act));
  }
  ctx.emb_dropout = mode.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f;
  ctx.seed = mode.seed;
  ctx.emb_stream = mode.site_stream(-1, 0);
  if (ctx.emb_dropout > 0) ops::dropout_forward(x, x, ctx.emb_dropout, ctx.seed, ctx.emb_stream);

  // RoPE always rotates by the position in the sequence, 0..s-1: Megatron-core computes the
  // rotary embedding from the sequence length and ignores --reset-position-ids for it (those
  // reset the learned absolute embeddings only). Attention across documents is governed by
  // doc_start (--reset-attention-mask) instead.
  TokenLayout layout;
  layout.doc_start = doc_start;
  Tensor hidden = decoder->forward(x.view({s, b, h}), layout, ctx.decoder, mode);

  // Output layer: logits = hidden @ W^T, W = word embeddings (tied) or output_layer.
  const Tensor& w = output_weight().value;
  ctx.hidden = w.dtype() == DType::kBF16 ? hidden.to(DType::kBF16) : hidden;
  ctx.hidden = ctx.hidden.view({s * b, h});
  ctx.logits = Tensor::empty({s * b, cfg_.padded_vocab_size}, act);
  ops::matmul(ctx.logits, ctx.hidden, false, w, true);
  return ctx.logits;
}

Tensor GPTModel::forward(const Tensor& tokens, const Tensor& labels, const Tensor& positions,
                         Ctx& ctx, const ForwardMode& mode, const Tensor& doc_start) const {
  forward_logits(tokens, positions, ctx, mode, doc_start);
  check_shape(labels, tokens.shape(), "GPTModel labels");
  const int64_t n = ctx.s * ctx.b;
  ctx.targets = transpose_bs(labels).view({n});
  Tensor loss_sb = Tensor::empty({n}, ctx.logits.dtype());
  ctx.lse = Tensor::empty({n}, ctx.logits.dtype());
  ops::cross_entropy_forward(loss_sb, ctx.lse, ctx.logits, ctx.targets, cfg_.vocab_size);
  // [s, b] -> [b, s]
  Tensor loss = Tensor::empty({ctx.b, ctx.s}, loss_sb.dtype());
  for (int64_t t = 0; t < ctx.s; ++t)
    for (int64_t i = 0; i < ctx.b; ++i)
      std::memcpy(
          static_cast<char*>(loss.raw()) + (i * ctx.s + t) * dtype_size(loss.dtype()),
          static_cast<const char*>(loss_sb.raw()) + (t * ctx.b + i) * dtype_size(loss.dtype()),
          dtype_size(loss.dtype()));
  return loss;
}

void GPTModel::backward(const Tensor& dloss, Ctx& ctx) const {
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size, n = s * b;
  check_shape(dloss, {b, s}, "GPTModel::backward dloss");
  Tensor dloss_sb = Tensor::empty({n}, ctx.logits.dtype());
  {
    Tensor d = dloss.dtype() == ctx.logits.dtype() ? dloss : dloss.to(ctx.logits.dtype());
    const size_t es = dtype_size(d.dtype());
    for (int64_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < b; ++i)
        std::memcpy(static_cast<char*>(dloss_sb.raw()) + (t * b + i) * es,
                    static_cast<const char*>(d.raw()) + (i * s + t) * es, es);
  }
  // dlogits overwrite the logits: no second [n, Vp] buffer.
  Tensor dlogits = ctx.logits;
  ops::cross_entropy_backward(dlogits, dloss_sb, ctx.logits, ctx.lse, ctx.targets, cfg_.vocab_size);
  const Param& w = output_weight();
  Tensor dl = w.value.dtype() == DType::kBF16 ? dlogits.to(DType::kBF16) : dlogits;
  ctx.logits = Tensor();
  dlogits = Tensor();
  Tensor dhidden = Tensor::empty({n, h}, ctx.lse.dtype());
  ops::matmul(dhidden, dl, false, w.value, false);
  Tensor dw = w.main_grad;
  ops::matmul(dw, dl, true, ctx.hidden, false, 1.0f);
  dl = Tensor();

  Tensor dx = decoder->backward(dhidden.view({s, b, h}), ctx.decoder).view({n, h});
  if (ctx.emb_dropout > 0) ops::dropout_backward(dx, dx, ctx.emb_dropout, ctx.seed, ctx.emb_stream);
  Tensor dwe = word_embeddings.main_grad;
  ops::embedding_backward(dwe, dx, ctx.ids);
  if (cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute) {
    Tensor dpe = position_embeddings.main_grad;
    ops::embedding_backward(dpe, dx, ctx.positions);
  }
  ctx = Ctx{};
}

}  // namespace megatron
