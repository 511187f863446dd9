// T5 forward and backward: encoder, decoder with cross-attention, LM head (see the header).
#include "models/t5/t5_model.h"

#include "core/error.h"
#include "models/common/vocab_shard.h"
#include "tensor/ops.h"
#include "transformer/kv_cache.h"

namespace megatron {

TransformerConfig t5_decoder_config(const TransformerConfig& cfg) {
  TransformerConfig d = cfg;
  d.num_layers = cfg.decoder_num_layers > 0 ? cfg.decoder_num_layers : cfg.num_layers;
  d.seq_length = cfg.decoder_seq_length > 0 ? cfg.decoder_seq_length : cfg.seq_length;
  return d;
}

T5Model::T5Model(const TransformerConfig& cfg, std::shared_ptr<ProcessGroup> tp,
                 bool sequence_parallel, ProcessGroup* amax)
    : cfg_(cfg), dec_cfg_(t5_decoder_config(cfg)), tp_group_(std::move(tp)) {
  if (!tp_group_) tp_group_ = make_self_process_group();
  tp_ = TensorParallelContext{tp_group_.get(), sequence_parallel, {}, {}, amax};
  vocab_shard(cfg_, tp_);
  embedding = std::make_unique<LanguageEmbedding>(cfg_, tp_);
  if (cfg_.position_embedding == PositionEmbedding::kRelative) {
    encoder_relative_pos_emb = std::make_unique<RelativePositionBias>(
        "encoder_relative_pos_emb", cfg_, tp_, /*bidirectional=*/true);
    decoder_relative_pos_emb = std::make_unique<RelativePositionBias>(
        "decoder_relative_pos_emb", cfg_, tp_, /*bidirectional=*/false);
  }
  encoder = std::make_unique<TransformerBlock>("encoder", cfg_, tp_, 0, cfg_.num_layers,
                                               /*with_final_norm=*/true);
  decoder = std::make_unique<TransformerBlock>(
      "decoder", dec_cfg_, tp_, 0, dec_cfg_.num_layers, /*with_final_norm=*/true,
      LayerOptions{.cross_attention = true, .stream_offset = cfg_.num_layers});
  const bool tied = !cfg_.untie_embeddings_and_output_weights;
  head = std::make_unique<LMHead>(cfg_, tp_, tied ? &embedding->word_embeddings : nullptr,
                                  /*output_bias=*/tied, "lm_head.");
  for (Param* p : parameters()) {
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
}

std::vector<Param*> T5Model::parameters() {
  std::vector<Param*> out;
  embedding->collect(out);
  if (encoder_relative_pos_emb) {
    encoder_relative_pos_emb->collect(out);
    decoder_relative_pos_emb->collect(out);
  }
  encoder->collect(out);
  decoder->collect(out);
  if (!head->own_weight.name.empty()) out.push_back(&head->own_weight);
  if (!head->bias.name.empty()) out.push_back(&head->bias);
  return out;
}

std::vector<const Param*> T5Model::outer_params() const {
  std::vector<const Param*> out;
  std::vector<Param*> emb;
  embedding->collect(emb);
  out.assign(emb.begin(), emb.end());
  if (encoder_relative_pos_emb) {
    out.push_back(&encoder_relative_pos_emb->weight);
    out.push_back(&decoder_relative_pos_emb->weight);
  }
  if (!head->own_weight.name.empty()) out.push_back(&head->own_weight);
  if (!head->bias.name.empty()) out.push_back(&head->bias);
  return out;
}

Shape T5Model::memory_shape(int64_t micro_batch_size) const {
  const int64_t s = cfg_.seq_length / (tp_.sp() ? tp_.size() : 1);
  return Shape{s, micro_batch_size, cfg_.hidden_size};
}

Tensor T5Model::run(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const {
  MEGATRON_CHECK(in.enc_tokens.defined() && in.enc_tokens.ndim() == 2 && in.dec_tokens.defined() &&
                     in.dec_tokens.ndim() == 2 && in.enc_tokens.dim(0) == in.dec_tokens.dim(0),
                 "T5Model: needs [b, s_enc] encoder and [b, s_dec] decoder tokens");
  const int64_t s_enc = in.enc_tokens.dim(1), s_dec = in.dec_tokens.dim(1);
  const ForwardMode::Use use(mode, outer_params());
  const DType bias_dtype = embedding->word_embeddings.value.dtype();

  TokenLayout enc;
  enc.causal = false;
  enc.key_valid = in.enc_valid;
  if (encoder_relative_pos_emb)
    enc.bias = encoder_relative_pos_emb->forward(s_enc, s_enc, bias_dtype);
  const Tensor x = embedding->forward(in.enc_tokens, Tensor(), Tensor(), ctx.enc_embedding, mode);
  const Tensor memory = encoder->forward(x, enc, ctx.encoder, mode);

  TokenLayout dec;
  dec.causal = true;
  dec.key_valid = in.dec_valid;
  dec.memory = memory;
  dec.memory_valid = in.enc_valid;
  if (decoder_relative_pos_emb)
    dec.bias = decoder_relative_pos_emb->forward(s_dec, s_dec, bias_dtype);
  // The shared embedding again, with a dropout stream of its own for the decoder's tokens.
  ForwardMode dec_mode = mode;
  dec_mode.stream = mode.site_stream(-1, 7);
  const Tensor y =
      embedding->forward(in.dec_tokens, Tensor(), Tensor(), ctx.dec_embedding, dec_mode);
  return decoder->forward(y, dec, ctx.decoder, mode);
}

Tensor T5Model::forward(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const {
  MEGATRON_CHECK(in.labels.defined(), "T5Model: training needs the labels");
  const ForwardMode::Use use(mode, outer_params());  // the head reads them after run()
  const Tensor hidden = run(in, ctx, mode);
  // Labels -1 (padding) would be out of every vocabulary shard; any id does, the loss mask
  // removes them.
  Tensor labels = in.labels.clone();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (labels.data<int64_t>()[i] < 0) labels.data<int64_t>()[i] = 0;
  return head->loss(hidden, labels, ctx.head);
}

void T5Model::backward(const Tensor& d_token_loss, Ctx& ctx, const ParamsDone& done) const {
  auto report = [&](std::vector<const Param*> ps) {
    if (done && !ps.empty()) done(ps);
  };
  done.begin(outer_params());
  const Tensor dh = head->loss_backward(d_token_loss, ctx.head);
  if (!head->bias.name.empty()) report({&head->bias});
  if (!head->own_weight.name.empty()) report({&head->own_weight});

  SideGrads dec_side;
  const Tensor dy = decoder->backward(dh, ctx.decoder, done, &dec_side);
  if (decoder_relative_pos_emb) {
    decoder_relative_pos_emb->backward(dec_side.bias);
    report({&decoder_relative_pos_emb->weight});
  }
  embedding->backward(dy, ctx.dec_embedding);
  MEGATRON_CHECK(dec_side.memory.defined(), "T5Model: the decoder gave no memory gradient");

  SideGrads enc_side;
  const Tensor dx = encoder->backward(dec_side.memory, ctx.encoder, done, &enc_side);
  if (encoder_relative_pos_emb) {
    encoder_relative_pos_emb->backward(enc_side.bias);
    report({&encoder_relative_pos_emb->weight});
  }
  embedding->backward(dx, ctx.enc_embedding);
  std::vector<Param*> ps;
  embedding->collect(ps);
  report(std::vector<const Param*>(ps.begin(), ps.end()));
  ctx = Ctx{};
}

Tensor T5Model::forward_logits(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const {
  MEGATRON_CHECK(tp_.size() == 1, "T5 logits of the whole vocabulary need one process");
  return head->logits(run(in, ctx, mode), ctx.head);
}

Tensor T5Model::encode(const Tensor& enc_tokens, const Tensor& enc_valid,
                       const ForwardMode& mode) const {
  MEGATRON_CHECK(!tp_.sp(), "T5Model: generation runs without sequence parallelism");
  MEGATRON_CHECK(enc_tokens.defined() && enc_tokens.ndim() == 2,
                 "T5Model: encode needs [b, s_enc] tokens");
  ForwardMode m = mode;
  m.kv_cache = nullptr;  // the encoder runs once over the whole prompt
  const int64_t s = enc_tokens.dim(1);
  TokenLayout enc;
  enc.causal = false;
  enc.key_valid = enc_valid;
  if (encoder_relative_pos_emb)
    enc.bias = encoder_relative_pos_emb->forward(s, s, embedding->word_embeddings.value.dtype());
  LanguageEmbedding::Ctx ectx;
  TransformerBlock::Ctx bctx;
  return encoder->forward(embedding->forward(enc_tokens, Tensor(), Tensor(), ectx, m), enc, bctx,
                          m);
}

Tensor T5Model::decode(const Tensor& dec_tokens, const Tensor& memory, const Tensor& enc_valid,
                       const ForwardMode& mode, bool last_only) const {
  MEGATRON_CHECK(!tp_.sp(), "T5Model: generation runs without sequence parallelism");
  MEGATRON_CHECK(dec_tokens.defined() && dec_tokens.ndim() == 2,
                 "T5Model: decode needs [b, s] tokens");
  const int64_t b = dec_tokens.dim(0), s = dec_tokens.dim(1);
  const int64_t offset = mode.kv_cache ? mode.kv_cache->offset() : 0;
  MEGATRON_CHECK(cfg_.position_embedding != PositionEmbedding::kLearnedAbsolute ||
                     offset + s <= cfg_.max_position_embeddings,
                 "T5 decoding past the ", cfg_.max_position_embeddings,
                 " learned positions (--max-position-embeddings)");
  Tensor positions = Tensor::empty({b, s}, DType::kI64);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < s; ++t) positions.data<int64_t>()[i * s + t] = offset + t;
  TokenLayout dec;
  dec.causal = true;
  dec.memory = memory;
  dec.memory_valid = enc_valid;
  if (decoder_relative_pos_emb) {
    dec.bias = decoder_relative_pos_emb->forward(s, offset + s,
                                                 embedding->word_embeddings.value.dtype(), offset);
  }
  ForwardMode dec_mode = mode;
  dec_mode.stream = mode.site_stream(-1, 7);
  LanguageEmbedding::Ctx ectx;
  TransformerBlock::Ctx bctx;
  Tensor hidden = decoder->forward(
      embedding->forward(dec_tokens, positions, Tensor(), ectx, dec_mode), dec, bctx, mode);
  if (last_only) hidden = hidden.slice0(hidden.dim(0) - 1, hidden.dim(0));
  return head->gathered_logits(hidden);
}

}  // namespace megatron
