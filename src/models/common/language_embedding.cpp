// LanguageEmbedding forward and backward: lookups, sums, dropout, the sequence-parallel split.
// With one TP rank the single-process lookup runs; else the vocab-parallel one
// (parallel/vocab_parallel.h: each rank looks up its rows, the partial sums are all-reduced).
#include "models/common/language_embedding.h"

#include "parallel/mappings.h"
#include "parallel/vocab_parallel.h"
#include "tensor/ops.h"
#include "transformer/sequence_dropout.h"

namespace megatron {

Tensor transpose_bs(const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2, "expected a [b, s] tensor, got ", x.str());
  Tensor y = Tensor::empty({x.dim(1), x.dim(0)}, x.dtype(), x.device());
  ops::transpose_2d(y, x);
  return y;
}

Tensor gather_rows(const Tensor& ids, const Tensor& table, DType act) {
  Tensor rows = Tensor::empty({ids.numel(), table.dim(1)}, table.dtype(), table.device());
  ops::embedding_forward(rows, ids, table);
  return rows.dtype() == act ? rows : rows.to(act);
}

namespace {

Tensor gather(const Tensor& ids, const Tensor& table, DType act) {
  return gather_rows(ids, table, act);
}

// A replicated [rows, h] table (every TP rank holds all of it).
void make_table(Param& p, const std::string& name, int64_t rows, const TransformerConfig& cfg,
                const TensorParallelContext& tp) {
  p.name = name;
  p.shape = {rows, cfg.hidden_size};
  p.init_std = cfg.init_method_std;
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
}

}  // namespace

LanguageEmbedding::LanguageEmbedding(const TransformerConfig& cfg, const TensorParallelContext& tp,
                                     int64_t num_tokentypes)
    : cfg_(cfg), tp_(tp), vocab_(vocab_shard(cfg, tp)) {
  make_vocab_table(word_embeddings, "embedding.word_embeddings.weight", cfg_, tp_);
  if (learned_positions()) {
    make_table(position_embeddings, "embedding.position_embeddings.weight",
               cfg_.max_position_embeddings, cfg_, tp_);
  }
  if (num_tokentypes > 0) {
    make_table(tokentype_embeddings, "embedding.tokentype_embeddings.weight", num_tokentypes, cfg_,
               tp_);
  }
  if (cfg_.post_layernorm) layernorm.emplace("embedding.layernorm", cfg_);
}

bool LanguageEmbedding::learned_positions() const {
  return cfg_.position_embedding == PositionEmbedding::kLearnedAbsolute;
}

void LanguageEmbedding::collect(std::vector<Param*>& out) {
  out.push_back(&word_embeddings);
  if (!position_embeddings.name.empty()) out.push_back(&position_embeddings);
  if (!tokentype_embeddings.name.empty()) out.push_back(&tokentype_embeddings);
  if (layernorm) layernorm->collect(out);
}

Tensor LanguageEmbedding::forward(const Tensor& tokens, const Tensor& positions,
                                  const Tensor& token_types, Ctx& ctx, const ForwardMode& mode,
                                  bool sequence_parallel_split, int64_t dropout_site) const {
  MEGATRON_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::kI64,
                 "LanguageEmbedding: tokens must be [b, s] i64, got ", tokens.str());
  const bool typed = !tokentype_embeddings.name.empty();
  MEGATRON_CHECK(token_types.defined() == typed, "LanguageEmbedding: token types are ",
                 typed ? "required (the model has token-type embeddings)"
                       : "given but the model has no token-type embeddings");
  ctx.b = tokens.dim(0);
  ctx.s = tokens.dim(1);
  const int64_t s = ctx.s, b = ctx.b, h = cfg_.hidden_size;
  MEGATRON_CHECK(s <= cfg_.max_position_embeddings || !learned_positions(), "sequence of length ",
                 s, " exceeds --max-position-embeddings (", cfg_.max_position_embeddings, ")");
  const DType act = word_embeddings.value.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;

  ctx.ids = transpose_bs(tokens);
  if (positions.defined()) {
    ctx.positions = transpose_bs(positions);
  } else {
    // The tokens' places in the sequence (under context parallelism, of the whole sequence).
    ctx.positions = on_device(cp_positions(s, b, tp_.cp), tokens.device());
  }

  Tensor x;
  if (tp_.size() == 1) {
    x = gather(ctx.ids, word_embeddings.value, act);
  } else {
    x = Tensor::empty({s * b, h}, act, word_embeddings.value.device());
    vocab_parallel_embedding_forward(x, ctx.ids, word_embeddings.value, vocab_.start, *tp_.group);
  }
  if (learned_positions())
    ops::add_inplace(x, gather(ctx.positions, position_embeddings.value, act));
  if (typed) {
    check_shape(token_types, {b, s}, "LanguageEmbedding token types");
    ctx.token_types = transpose_bs(token_types);
    ops::add_inplace(x, gather(ctx.token_types, tokentype_embeddings.value, act));
  }
  // --use-mup's embedding multiplier, on the sum of the embeddings before dropout (Megatron core
  // 0.19's LanguageModelEmbedding).
  if (cfg_.mup.enabled && cfg_.mup.embedding_mult != 1.0)
    ops::scale_inplace(x, cfg_.mup.embedding_mult);
  ctx.dropout = mode.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f;
  ctx.seed = mode.seed;
  ctx.stream = mode.site_stream(dropout_site, 0);
  x = x.view({s, b, h});
  if (layernorm) x = layernorm->forward(x, ctx.norm);
  if (ctx.dropout > 0)
    sequence_dropout_forward(x, x, ctx.dropout, ctx.seed, ctx.stream, tp_, false);
  ctx.scattered = tp_.sp() && sequence_parallel_split;
  return ctx.scattered ? scatter_to_sequence_parallel_region_forward(x, *tp_.group) : x;
}

void LanguageEmbedding::backward(const Tensor& dy, Ctx& ctx) const {
  const int64_t n = ctx.s * ctx.b, h = cfg_.hidden_size;
  Tensor dx = (ctx.scattered ? scatter_to_sequence_parallel_region_backward(dy, *tp_.group) : dy)
                  .view({n, h});
  if (ctx.dropout > 0) {
    // Into a fresh tensor: the caller's gradient is not ours to change.
    Tensor masked = Tensor::empty({ctx.s, ctx.b, h}, dx.dtype(), dx.device());
    sequence_dropout_backward(masked, dx.view({ctx.s, ctx.b, h}), ctx.dropout, ctx.seed, ctx.stream,
                              tp_, false);
    dx = masked.view({n, h});
  }
  if (layernorm) dx = layernorm->backward(dx.view({ctx.s, ctx.b, h}), ctx.norm).view({n, h});
  if (cfg_.mup.enabled && cfg_.mup.embedding_mult != 1.0) {
    Tensor scaled = dx.clone();  // the caller's gradient is not ours to change
    ops::scale_inplace(scaled, cfg_.mup.embedding_mult);
    dx = scaled;
  }
  Tensor dwe = word_embeddings.main_grad;
  if (!dwe.defined()) {
    // frozen without gradient storage (Param::requires_grad): the tables get nothing
  } else if (tp_.size() == 1) {
    ops::embedding_backward(dwe, dx, ctx.ids);
  } else {
    vocab_parallel_embedding_backward(dwe, dx, ctx.ids, vocab_.start);
  }
  word_embeddings.main_grad_zero = false;  // the output layer's GEMM may add to it next
  if (learned_positions() && position_embeddings.main_grad.defined()) {
    Tensor dpe = position_embeddings.main_grad;
    ops::embedding_backward(dpe, dx, ctx.positions);
  }
  if (ctx.token_types.defined() && tokentype_embeddings.main_grad.defined()) {
    Tensor dte = tokentype_embeddings.main_grad;
    ops::embedding_backward(dte, dx, ctx.token_types);
  }
  ctx = Ctx{};
}

}  // namespace megatron
