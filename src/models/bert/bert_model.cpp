// BERT forward and backward over the shared language-model parts, staged over the pipeline.
#include "models/bert/bert_model.h"

#include <algorithm>

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

BertModel::BertModel(const TransformerConfig& cfg, BertStage stage)
    : cfg_(cfg), stage_(std::move(stage)) {
  if (!stage_.tp) stage_.tp = make_self_process_group();
  if (stage_.num_layers < 0) stage_.num_layers = cfg_.num_layers - stage_.first_layer;
  tp_ = TensorParallelContext{stage_.tp.get(), stage_.sequence_parallel, {}, {}, stage_.amax};
  vocab_shard(cfg_, tp_);
  if (stage_.pre_process) {
    // pretrain_bert.py: two token types (sentence A and B) with the binary head, none without;
    // Megatron's Classification model always has two.
    const bool typed = stage_.binary_head || stage_.num_classes > 0;
    embedding = std::make_unique<LanguageEmbedding>(cfg_, tp_, typed ? 2 : 0);
  }
  encoder = std::make_unique<TransformerBlock>("encoder", cfg_, tp_, stage_.first_layer,
                                               stage_.num_layers, stage_.post_process);
  if (stage_.post_process && stage_.num_classes > 0) {
    pooler = std::make_unique<Pooler>("pooler", cfg_.hidden_size, cfg_.init_method_std, tp_);
    classification_head =
        std::make_unique<Linear>("classification_head", cfg_.hidden_size, stage_.num_classes,
                                 /*with_bias=*/true, cfg_.init_method_std);
  } else if (stage_.post_process) {
    lm_dense = std::make_unique<Linear>("lm_head.dense", cfg_.hidden_size, cfg_.hidden_size,
                                        /*with_bias=*/true, cfg_.init_method_std);
    lm_norm = std::make_unique<Norm>("lm_head.layer_norm", cfg_);
    // Megatron marks the LM head's dense and norm sequence-parallel: each rank sees s/tp rows.
    lm_dense->weight.sequence_parallel = lm_dense->bias.sequence_parallel = tp_.sp();
    lm_norm->mark_sequence_parallel(tp_.sp());
    head = std::make_unique<LMHead>(cfg_, tp_, embedding ? &embedding->word_embeddings : nullptr,
                                    /*output_bias=*/true);
    if (stage_.binary_head) {
      pooler = std::make_unique<Pooler>("pooler", cfg_.hidden_size, cfg_.init_method_std, tp_);
      binary_head = std::make_unique<Linear>("binary_head", cfg_.hidden_size, 2,
                                             /*with_bias=*/true, cfg_.init_method_std);
    }
  }
  for (Param* p : parameters()) {
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
}

std::vector<Param*> BertModel::parameters() {
  std::vector<Param*> out;
  if (embedding) embedding->collect(out);
  if (head && head->holds_embedding_copy()) out.push_back(&head->own_weight);
  encoder->collect(out);
  if (lm_dense) {
    lm_dense->collect(out);
    lm_norm->collect(out);
  }
  if (head) {
    if (!head->own_weight.name.empty() && !head->holds_embedding_copy())
      out.push_back(&head->own_weight);
    out.push_back(&head->bias);
  }
  if (pooler) pooler->collect(out);
  if (binary_head) binary_head->collect(out);
  if (classification_head) classification_head->collect(out);
  return out;
}

Shape BertModel::activation_shape(int64_t micro_batch_size) const {
  const int64_t s = cfg_.seq_length / (tp_.sp() ? tp_.size() : 1);
  return Shape{s, micro_batch_size, cfg_.hidden_size};
}

TokenLayout BertModel::layout(const BertInputs& in) const {
  MEGATRON_CHECK(in.padding_mask.defined() && in.padding_mask.ndim() == 2,
                 "BertModel: every stage needs the [b, s] padding mask");
  TokenLayout l;
  l.causal = false;
  l.key_valid = in.padding_mask;
  return l;
}

std::vector<const Param*> BertModel::outer_params() const {
  std::vector<Param*> all = const_cast<BertModel*>(this)->parameters(), block;
  encoder->collect(block);
  std::vector<const Param*> out;
  for (const Param* p : all)
    if (std::find(block.begin(), block.end(), p) == block.end()) out.push_back(p);
  return out;
}

Tensor BertModel::lm_transform(const Tensor& hidden, Ctx& ctx) const {
  ctx.hidden_shape = hidden.shape();
  const int64_t n = hidden.numel() / cfg_.hidden_size;
  ctx.lm_pre_gelu = lm_dense->forward(hidden.view({n, cfg_.hidden_size}), ctx.lm_dense);
  Tensor g =
      Tensor::empty(ctx.lm_pre_gelu.shape(), ctx.lm_pre_gelu.dtype(), ctx.lm_pre_gelu.device());
  ops::gelu_forward(g, ctx.lm_pre_gelu, /*tanh_approx=*/false);  // torch's erf GELU
  return lm_norm->forward(g.view(hidden.shape()), ctx.lm_norm);
}

Tensor BertModel::lm_transform_backward(const Tensor& d, Ctx& ctx) const {
  const int64_t n = ctx.lm_pre_gelu.dim(0);
  const Tensor dg = lm_norm->backward(d, ctx.lm_norm).view({n, cfg_.hidden_size});
  Tensor dz = Tensor::empty(dg.shape(), dg.dtype(), dg.device());
  ops::gelu_backward(dz, dg, ctx.lm_pre_gelu, /*tanh_approx=*/false);
  ctx.lm_pre_gelu = Tensor();
  return lm_dense->backward(dz, ctx.lm_dense).view(ctx.hidden_shape);
}

BertModel::Outputs BertModel::forward_stage(const Tensor& hidden_in, const BertInputs& in,
                                            const Tensor& is_random, Ctx& ctx,
                                            const ForwardMode& mode) const {
  // --overlap-param-gather: the embedding's and the heads' weights are complete before use (the
  // encoder's layers wait for theirs one by one).
  const ForwardMode::Use use(mode, outer_params());
  Tensor x;
  if (stage_.pre_process) {
    MEGATRON_CHECK(in.tokens.defined() && in.tokens.ndim() == 2,
                   "BertModel: the first stage needs [b, s] tokens");
    x = embedding->forward(in.tokens, Tensor(), typed() ? in.types : Tensor(), ctx.embedding, mode);
  } else {
    MEGATRON_CHECK(hidden_in.defined() && hidden_in.ndim() == 3,
                   "BertModel: a later pipeline stage needs the previous stage's [s, b, h] output");
    x = hidden_in;
  }
  Tensor hidden = encoder->forward(x, layout(in), ctx.encoder, mode);
  Outputs out;
  if (!stage_.post_process) {
    out.hidden = hidden;
    return out;
  }
  if (classification_head) {
    // Megatron's Classification: dropout (--hidden-dropout) on the pooled output, then the head.
    Tensor pooled = pooler->forward(hidden, ctx.pooler);
    ctx.dropout = mode.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f;
    ctx.seed = mode.seed;
    ctx.stream = mode.site_stream(-1, 1);
    if (ctx.dropout > 0) {
      Tensor dropped = Tensor::empty(pooled.shape(), pooled.dtype(), pooled.device());
      ops::dropout_forward(dropped, pooled, ctx.dropout, ctx.seed, ctx.stream);
      pooled = dropped;
    }
    out.logits = classification_head->forward(pooled, ctx.classifier);
    return out;
  }
  // Labels -1 (no prediction) would be out of every vocabulary shard; any id does, the loss
  // mask removes them (Megatron's vocab-parallel loss sees -1 as a zero target logit).
  MEGATRON_CHECK(in.labels.defined(), "BertModel: the last stage needs the labels");
  Tensor labels = in.labels.clone();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (labels.data<int64_t>()[i] < 0) labels.data<int64_t>()[i] = 0;
  out.token_loss = head->loss(lm_transform(hidden, ctx), labels, ctx.head);
  if (stage_.binary_head) {
    const int64_t b = hidden.dim(1);
    MEGATRON_CHECK(is_random.defined() && is_random.numel() == b,
                   "BertModel: the binary head needs is_random [b]");
    ctx.sop_logits = binary_head->forward(pooler->forward(hidden, ctx.pooler), ctx.binary);
    ctx.sop_targets = is_random.view({b});
    ctx.sop_lse = Tensor::empty({b}, ctx.sop_logits.dtype(), ctx.sop_logits.device());
    out.sop_loss = Tensor::empty({b}, ctx.sop_logits.dtype(), ctx.sop_logits.device());
    ops::cross_entropy_forward(out.sop_loss, ctx.sop_lse, ctx.sop_logits, ctx.sop_targets, 2);
  }
  return out;
}

Tensor BertModel::backward_stage(const Tensor& d_token_loss, const Tensor& d_sop_loss,
                                 const Tensor& d_hidden, Ctx& ctx, const ParamsDone& done) const {
  auto report = [&](std::vector<const Param*> ps) {
    if (done && !ps.empty()) done(ps);
  };
  done.begin(outer_params());
  Tensor dh = d_hidden;
  if (stage_.post_process && classification_head) {
    Tensor dpooled = classification_head->backward(d_token_loss, ctx.classifier);
    if (ctx.dropout > 0) {
      Tensor d = Tensor::empty(dpooled.shape(), dpooled.dtype(), dpooled.device());
      ops::dropout_backward(d, dpooled, ctx.dropout, ctx.seed, ctx.stream);
      dpooled = d;
    }
    dh = pooler->backward(dpooled, ctx.pooler);
    report({&classification_head->weight, &classification_head->bias, &pooler->dense.weight,
            &pooler->dense.bias});
  } else if (stage_.post_process) {
    dh = lm_transform_backward(head->loss_backward(d_token_loss, ctx.head), ctx);
    std::vector<const Param*> final_now = {&lm_dense->weight, &lm_dense->bias, &lm_norm->weight,
                                           &head->bias};
    if (!lm_norm->bias.name.empty()) final_now.push_back(&lm_norm->bias);
    if (!(embedding && &head->weight() == &embedding->word_embeddings))
      final_now.push_back(&head->weight());
    if (stage_.binary_head) {
      MEGATRON_CHECK(d_sop_loss.defined(), "BertModel: the binary head needs d_sop_loss");
      Tensor dlogits =
          Tensor::empty(ctx.sop_logits.shape(), ctx.sop_logits.dtype(), ctx.sop_logits.device());
      const Tensor d =
          d_sop_loss.dtype() == dlogits.dtype() ? d_sop_loss : d_sop_loss.to(dlogits.dtype());
      ops::cross_entropy_backward(dlogits, d, ctx.sop_logits, ctx.sop_lse, ctx.sop_targets, 2);
      const Tensor dpool = pooler->backward(binary_head->backward(dlogits, ctx.binary), ctx.pooler);
      ops::add_inplace(dh, dpool);
      for (const Param* p :
           {&binary_head->weight, &binary_head->bias, &pooler->dense.weight, &pooler->dense.bias})
        final_now.push_back(p);
    }
    report(final_now);
  }
  Tensor dx = encoder->backward(dh, ctx.encoder, done);
  if (stage_.pre_process) {
    embedding->backward(dx, ctx.embedding);
    std::vector<Param*> ps;
    embedding->collect(ps);
    report(std::vector<const Param*>(ps.begin(), ps.end()));
    dx = Tensor();
  }
  ctx = Ctx{};
  return dx;
}

std::pair<Tensor, Tensor> BertModel::forward_logits(const BertInputs& in, Ctx& ctx,
                                                    const ForwardMode& mode) const {
  MEGATRON_CHECK(stage_.pre_process && stage_.post_process && tp_.size() == 1,
                 "BERT logits of the whole vocabulary need the whole model in one process");
  const Tensor x =
      embedding->forward(in.tokens, Tensor(), typed() ? in.types : Tensor(), ctx.embedding, mode);
  const Tensor hidden = encoder->forward(x, layout(in), ctx.encoder, mode);
  Tensor mlm = head->logits(lm_transform(hidden, ctx), ctx.head);
  Tensor sop;
  if (stage_.binary_head)
    sop = binary_head->forward(pooler->forward(hidden, ctx.pooler), ctx.binary);
  return {mlm, sop};
}

}  // namespace megatron
