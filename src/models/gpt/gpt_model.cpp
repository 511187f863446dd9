// GPT forward and backward: the embedding, the decoder and the LM head of models/common, staged
// over the pipeline, with the parameters' tensor-parallel coordinates.
#include "models/gpt/gpt_model.h"

#include <cmath>

#include "tensor/ops.h"
#include "transformer/kv_cache.h"

#include <utility>

namespace megatron {

GPTModel::GPTModel(const TransformerConfig& cfg, GPTStage stage)
    : cfg_(cfg), stage_(std::move(stage)) {
  if (!stage_.tp) stage_.tp = make_self_process_group();
  if (stage_.num_layers < 0) stage_.num_layers = cfg_.num_layers - stage_.first_layer;
  tp_ = TensorParallelContext{stage_.tp.get(), stage_.sequence_parallel, stage_.cp, stage_.expert,
                              stage_.amax};
  vocab_shard(cfg_, tp_);  // every stage refuses a vocabulary the TP size does not divide
  const bool mtp_here = stage_.post_process && cfg_.mtp_num_layers > 0;
  if (stage_.pre_process || mtp_here) embedding = std::make_unique<LanguageEmbedding>(cfg_, tp_);
  // The last stage's copy for multi-token prediction (see the header).
  if (!stage_.pre_process && embedding) embedding->word_embeddings.shared_embedding = true;
  decoder = std::make_unique<TransformerBlock>("decoder", cfg_, tp_, stage_.first_layer,
                                               stage_.num_layers, stage_.post_process);
  if (stage_.post_process) {
    head = std::make_unique<LMHead>(cfg_, tp_, embedding ? &embedding->word_embeddings : nullptr);
  }
  if (mtp_here) mtp = std::make_unique<MultiTokenPrediction>(cfg_, tp_);
  // Every parameter knows its TP coordinates, replicated ones too: the gradient norm counts a
  // replicated parameter on TP rank 0 only. Experts keep theirs: they are split over the expert
  // tensor-parallel group, not the dense TP group.
  for (Param* p : parameters()) {
    if (p->expert_parallel) continue;
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
  apply_init_methods();
}

void GPTModel::apply_init_methods() {
  // Megatron's TransformerConfig: the embeddings take embedding_init_method, which is
  // N(0, --embedding-init-method-std) when that differs from --init-method-std, else the
  // init_method itself; --init-method-xavier-uniform makes the init_method (and the scaled one of
  // the output projections) Xavier-uniform. Norms and biases keep theirs.
  //
  // --use-mup (Megatron core 0.19): init_method is N(0, std / sqrt(m)) and the output
  // projections' scaled one std / (sqrt(2 layers) sqrt(m)), i.e. every matrix drawn from
  // --init-method-std here divided by sqrt(m); the embeddings keep N(0, embedding std), which an
  // untied output layer takes too.
  const bool xavier = cfg_.init_method_xavier_uniform;
  const bool mup = cfg_.mup.enabled;
  const double emb_std = cfg_.embedding_init_method_std;
  const bool emb_own = emb_std > 0 && emb_std != cfg_.init_method_std;
  for (Param* p : parameters()) {
    if (p->init != Init::kNormal) continue;
    const bool emb = p->name == "embedding.word_embeddings.weight" ||
                     p->name == "embedding.position_embeddings.weight";
    const bool mup_emb = mup && (emb || p->name == "output_layer.weight");
    if ((emb && emb_own) || mup_emb) {
      p->init_std = emb_std > 0 ? emb_std : cfg_.init_method_std;
    } else if (xavier) {
      p->init = Init::kXavierUniform;
    } else if (mup) {
      p->init_std /= std::sqrt(cfg_.mup.width_mult);
    }
  }
}

std::vector<Param*> GPTModel::parameters() {
  std::vector<Param*> out;
  if (embedding) embedding->collect(out);
  // The tied copy of the word embeddings comes first, where the embedding would be.
  if (head && head->holds_embedding_copy()) out.push_back(&head->own_weight);
  decoder->collect(out);
  if (mtp) mtp->collect(out);
  if (head && !head->own_weight.name.empty() && !head->holds_embedding_copy()) {
    out.push_back(&head->own_weight);
  }
  return out;
}

const Param* GPTModel::word_embeddings() const {
  if (embedding) return &embedding->word_embeddings;
  if (head && head->holds_embedding_copy()) return &head->own_weight;
  return nullptr;
}

Param* GPTModel::word_embeddings() {
  return const_cast<Param*>(std::as_const(*this).word_embeddings());
}

Shape GPTModel::activation_shape(int64_t micro_batch_size) const {
  const int64_t s = cfg_.seq_length / tp_.cp.size() / (tp_.sp() ? tp_.size() : 1);
  return Shape{s, micro_batch_size, cfg_.hidden_size};
}

Tensor GPTModel::forward_stage(const Tensor& hidden_in, const GPTInputs& in, Ctx& ctx,
                               const ForwardMode& mode) const {
  Tensor x;
  ctx.decoder_input = in.decoder_input.defined();
  if (ctx.decoder_input) {
    MEGATRON_CHECK(in.decoder_input.ndim() == 3,
                   "GPTModel: the decoder input must be [s, b, h], got ", in.decoder_input.str());
    x = in.decoder_input;
  } else if (stage_.pre_process) {
    MEGATRON_CHECK(in.tokens.defined() && in.tokens.ndim() == 2,
                   "GPTModel: the first stage needs [b, s] tokens");
    const std::vector<const Param*> ps =
        named({&embedding->word_embeddings, &embedding->position_embeddings});
    mode.need(ps);
    x = embedding->forward(in.tokens, in.positions, Tensor(), ctx.embedding, mode);
    mode.release(ps);
  } else {
    MEGATRON_CHECK(hidden_in.defined() && hidden_in.ndim() == 3,
                   "GPTModel: a later pipeline stage needs the previous stage's [s, b, h] output");
    x = hidden_in;
  }
  // RoPE always rotates by the position in the sequence, 0..s-1 (under context parallelism the
  // chunks' global positions): Megatron-core computes the
  // rotary embedding from the sequence length and ignores --reset-position-ids for it (those
  // reset the learned absolute embeddings only). Attention across documents is governed by
  // doc_start (--reset-attention-mask) instead.
  TokenLayout layout;
  layout.doc_start = in.doc_start;
  layout.packed = in.packed && in.doc_start.defined();
  if (layout.packed) {
    layout.whole_doc_start =
        tp_.cp.enabled() ? cp_whole_doc_start(in.doc_start, tp_.cp) : in.doc_start;
  }
  if (tp_.cp.enabled()) {  // this rank's chunks sit at their places in the whole sequence
    const int64_t local = cfg_.seq_length / tp_.cp.size();
    layout.positions = on_device(cp_positions(local, x.dim(1), tp_.cp), x.device());
  }
  Tensor hidden = decoder->forward(x, layout, ctx.decoder, mode);
  if (!stage_.post_process) return hidden;
  const ForwardMode::Use use(mode, named({&head->weight()}));
  if (mtp && mode.training) {
    MEGATRON_CHECK(in.tokens.defined(),
                   "GPTModel: multi-token prediction needs the tokens on the "
                   "last stage");
    std::vector<Param*> ps;
    mtp->collect(ps);
    std::vector<const Param*> gated(ps.begin(), ps.end());
    gated.push_back(&embedding->word_embeddings);
    const ForwardMode::Use use_mtp(mode, gated);
    ctx.mtp_losses =
        mtp->forward(hidden, in.tokens, in.labels, *embedding, *head, layout, ctx.mtp, mode);
  }
  return head->loss(hidden, in.labels, ctx.head);
}

Tensor GPTModel::infer_stage(const Tensor& hidden_in, const Tensor& tokens, const Tensor& positions,
                             const ForwardMode& mode, bool last_only,
                             const Tensor& decoder_input) const {
  MEGATRON_CHECK(!tp_.sp() && !tp_.cp.enabled(),
                 "GPTModel: inference runs without sequence or context parallelism");
  MEGATRON_CHECK(!mode.training, "GPTModel: inference runs without dropout");
  Tensor x;
  if (decoder_input.defined()) {
    x = decoder_input;
  } else if (stage_.pre_process) {
    MEGATRON_CHECK(tokens.defined() && tokens.ndim() == 2,
                   "GPTModel: the first stage needs [b, s] tokens");
    Tensor pos = positions;
    if (!pos.defined() && mode.kv_cache && mode.kv_cache->offset() > 0) {
      const int64_t b = tokens.dim(0), s = tokens.dim(1), offset = mode.kv_cache->offset();
      pos = Tensor::empty({b, s}, DType::kI64);
      for (int64_t i = 0; i < b; ++i)
        for (int64_t t = 0; t < s; ++t) pos.data<int64_t>()[i * s + t] = offset + t;
      pos = on_device(pos, tokens.device());  // built on the host, used where the tokens are
    }
    LanguageEmbedding::Ctx ectx;
    x = embedding->forward(tokens, pos, Tensor(), ectx, mode);
  } else {
    MEGATRON_CHECK(hidden_in.defined() && hidden_in.ndim() == 3,
                   "GPTModel: a later pipeline stage needs the previous stage's [s, b, h] output");
    x = hidden_in;
  }
  TransformerBlock::Ctx dctx;
  Tensor hidden = decoder->forward(x, TokenLayout{}, dctx, mode);
  if (!stage_.post_process) return hidden;
  if (last_only) hidden = hidden.slice0(hidden.dim(0) - 1, hidden.dim(0));
  return head->gathered_logits(hidden);
}

std::vector<const Param*> GPTModel::named(std::initializer_list<const Param*> ps) {
  std::vector<const Param*> out;
  for (const Param* p : ps)
    if (p && !p->name.empty()) out.push_back(p);
  return out;
}

void GPTModel::report_all(const ParamsDone& done, const std::vector<const Param*>& ps) const {
  if (done && !ps.empty()) done(ps);
}

void GPTModel::report(const ParamsDone& done, std::initializer_list<const Param*> ps) const {
  if (!done) return;
  const std::vector<const Param*> out = named(ps);
  if (!out.empty()) done(out);
}

Tensor GPTModel::backward_stage(const Tensor& d, Ctx& ctx, const ParamsDone& done) const {
  Tensor dh = d;
  if (stage_.post_process) {
    done.begin(named({&head->weight()}));
    dh = head->loss_backward(d, ctx.head);
    if (!ctx.mtp_losses.empty()) {
      // Multi-token prediction adds to the decoder output's gradient, the head's and the
      // embedding's.
      MEGATRON_CHECK(ctx.mtp_dlosses.size() == ctx.mtp_losses.size(),
                     "GPTModel: multi-token prediction's loss gradients are missing");
      std::vector<Param*> ps;
      mtp->collect(ps);
      std::vector<const Param*> mine(ps.begin(), ps.end());
      // The word embeddings receive the rolled tokens' gradients here, before the first stage's
      // own lookup (FSDP attaches their gradient buffer on begin).
      std::vector<const Param*> used = mine;
      used.push_back(&embedding->word_embeddings);
      done.begin(used);
      ops::add_inplace(dh, mtp->backward(ctx.mtp_dlosses, *embedding, *head, ctx.mtp));
      report_all(done, mine);
      // The last stage's copy of the word embeddings is final (the first stage's is final after
      // its own lookup's backward, below).
      if (!stage_.pre_process) report(done, {&embedding->word_embeddings});
    }
    // The output weight is final here unless it is the word embedding of this same stage (the
    // lookup's backward below adds to it), or multi-token prediction's copy reported above.
    const bool is_embedding = embedding && &head->weight() == &embedding->word_embeddings;
    const bool reported = is_embedding && !ctx.mtp_losses.empty() && !stage_.pre_process;
    if (!(is_embedding && stage_.pre_process) && !reported) report(done, {&head->weight()});
  }
  Tensor dx = decoder->backward(dh, ctx.decoder, done);
  if (stage_.pre_process && !ctx.decoder_input) {
    done.begin(named({&embedding->word_embeddings, &embedding->position_embeddings}));
    embedding->backward(dx, ctx.embedding);
    report(done, {&embedding->word_embeddings, &embedding->position_embeddings});
    dx = Tensor();
  }
  ctx = Ctx{};
  return dx;
}

Tensor GPTModel::forward(const Tensor& tokens, const Tensor& labels, const Tensor& positions,
                         Ctx& ctx, const ForwardMode& mode, const Tensor& doc_start,
                         bool packed) const {
  MEGATRON_ASSERT(stage_.pre_process && stage_.post_process, "forward() runs the whole model");
  return forward_stage(Tensor(), GPTInputs{tokens, labels, positions, doc_start, Tensor(), packed},
                       ctx, mode);
}

void GPTModel::backward(const Tensor& dloss, Ctx& ctx) const {
  backward_stage(dloss, ctx);
}

Tensor GPTModel::forward_logits(const Tensor& tokens, const Tensor& positions, Ctx& ctx,
                                const ForwardMode& mode, const Tensor& doc_start) const {
  MEGATRON_CHECK(stage_.pre_process && stage_.post_process && tp_.size() == 1,
                 "logits of the whole vocabulary need the whole model in one process");
  MEGATRON_CHECK(tokens.ndim() == 2, "GPTModel: tokens must be [b, s] i64, got ", tokens.str());
  TokenLayout layout;
  layout.doc_start = doc_start;
  const Tensor x = embedding->forward(tokens, positions, Tensor(), ctx.embedding, mode);
  return head->logits(decoder->forward(x, layout, ctx.decoder, mode), ctx.head);
}

}  // namespace megatron
