// BertModel stages behind the ModelChunk interface, and pretrain_bert.py's loss.
#include "models/bert/bert_chunk.h"

#include <algorithm>

#include "core/error.h"
#include "data/gpt_batch.h"  // kTokens, kLabels, kLossMask
#include "models/gpt/gpt_memory.h"
#include "tensor/ops.h"

namespace megatron {

namespace {
constexpr const char* kHidden = "hidden";
constexpr const char* kTokenLoss = "per-token loss";
constexpr const char* kSopLoss = "sop loss";
constexpr const char* kLogits = "logits";
}  // namespace

std::vector<std::unique_ptr<ModelChunk>> build_bert_chunks(const ModelOptions& o,
                                                           const ChunkPlacement& p,
                                                           int64_t num_classes) {
  MEGATRON_CHECK(!p.cp.enabled(), "BERT attends both ways: --context-parallel-size must be 1");
  MEGATRON_CHECK(!o.config.moe.enabled(),
                 "BERT with Mixture-of-Experts layers is not supported; drop --num-experts");
  MEGATRON_CHECK(!o.reset_attention_mask,
                 "--reset-attention-mask applies to GPT documents, not to BERT's sentence pairs; "
                 "drop it");
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (const ChunkLayers& l : chunk_layers(o.config.num_layers, p)) {
    chunks.push_back(std::make_unique<BertChunk>(
        o.config, BertStage{.tp = p.tp,
                            .sequence_parallel = p.sequence_parallel,
                            .first_layer = l.first_layer,
                            .num_layers = l.num_layers,
                            .pre_process = l.pre_process,
                            .post_process = l.post_process,
                            .binary_head = num_classes == 0 && o.config.bert_binary_head,
                            .num_classes = num_classes,
                            .amax = p.amax}));
  }
  return chunks;
}

int64_t bert_activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg,
                              int64_t micro_batch_size) {
  const auto* b = dynamic_cast<const BertChunk*>(&chunk);
  MEGATRON_ASSERT(b != nullptr, "a BERT spec function was given another model's chunk");
  const BertStage& st = b->model().stage();
  const int tp = st.tp ? st.tp->size() : 1;
  return activation_bytes_per_microbatch(
      cfg, ActivationShape{.micro_batch_size = micro_batch_size,
                           .tp = tp,
                           .sequence_parallel = st.sequence_parallel && tp > 1,
                           .num_layers = st.num_layers,
                           .first_layer = st.first_layer,
                           .pre_process = st.pre_process,
                           .post_process = st.post_process,
                           .cp = 1});
}

DType bert_batch_field_dtype(const std::string& name) {
  if (name == kTokens || name == kLabels || name == kBertTypes || name == kBertIsRandom ||
      name == kClassLabel)
    return DType::kI64;
  if (name == kBertPaddingMask) return DType::kI32;
  if (name == kLossMask) return DType::kF32;
  MEGATRON_CHECK(false, "'", name, "' is not a BERT batch field");
  return DType::kF32;
}

BertChunk::BertChunk(const TransformerConfig& cfg, BertStage stage)
    : model_(cfg, std::move(stage)) {}

std::unique_ptr<ModelChunk::Ctx> BertChunk::new_ctx() const {
  return std::make_unique<BertCtx>();
}

std::vector<TensorSpec> BertChunk::recv_specs(int64_t micro_batch_size) const {
  if (model_.stage().pre_process) return {};
  return {TensorSpec{kHidden, model_.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<TensorSpec> BertChunk::send_specs(int64_t micro_batch_size) const {
  if (model_.stage().post_process) return {};
  return {TensorSpec{kHidden, model_.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<std::string> BertChunk::batch_fields() const {
  std::vector<std::string> fields;
  const BertStage& st = model_.stage();
  const bool classifier = st.num_classes > 0;
  if (st.pre_process) {
    fields.emplace_back(kTokens);
    if (st.binary_head || classifier) fields.emplace_back(kBertTypes);
  }
  fields.emplace_back(kBertPaddingMask);
  if (st.post_process && classifier) {
    fields.emplace_back(kClassLabel);
  } else if (st.post_process) {
    fields.insert(fields.end(), {kLabels, kLossMask});
    if (st.binary_head) fields.emplace_back(kBertIsRandom);
  }
  return fields;
}

TensorMap BertChunk::forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                             const ForwardMode& mode) const {
  const BertInputs inputs{batch.get(kTokens), batch.get(kBertTypes), batch.get(kBertPaddingMask),
                          batch.get(kLabels)};
  const BertModel::Outputs out = model_.forward_stage(
      in.get(kHidden), inputs, batch.get(kBertIsRandom), static_cast<BertCtx&>(ctx).model, mode);
  if (!is_last()) return TensorMap{{kHidden, out.hidden}};
  if (out.logits.defined()) return TensorMap{{kLogits, out.logits}};
  TensorMap result{{kTokenLoss, out.token_loss}};
  if (out.sop_loss.defined()) result.set(kSopLoss, out.sop_loss);
  return result;
}

TensorMap BertChunk::backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const {
  const bool classifier = model_.stage().num_classes > 0;
  Tensor dx = is_last() ? model_.backward_stage(dout.at(classifier ? kLogits : kTokenLoss),
                                                dout.get(kSopLoss), Tensor(),
                                                static_cast<BertCtx&>(ctx).model, done)
                        : model_.backward_stage(Tensor(), Tensor(), dout.at(kHidden),
                                                static_cast<BertCtx&>(ctx).model, done);
  if (model_.stage().pre_process) return {};
  return TensorMap{{kHidden, dx}};
}

LossTerms ClassificationLoss::forward(const TensorMap& out, const TensorMap& batch,
                                      const ObjectiveScale& scale, TensorMap* dout) const {
  MEGATRON_CHECK(!scale.per_token,
                 "--calculate-per-token-loss does not apply to classification "
                 "finetuning (the loss is each micro-batch's mean); drop the flag");
  const Tensor logits = out.at(kLogits).to(DType::kF32);
  const Tensor& labels = batch.at(kClassLabel);
  const int64_t b = logits.dim(0), c = logits.dim(1);
  Tensor targets = Tensor::empty({b}, DType::kI64);
  int64_t counted = 0, correct = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t y = labels.data<int64_t>()[i];
    MEGATRON_CHECK(y < c, "class ", y, " is outside the classifier's ", c, " classes");
    targets.data<int64_t>()[i] = std::max<int64_t>(y, 0);
    if (y < 0) continue;
    ++counted;
    const float* row = logits.data<float>() + i * c;
    correct += (std::max_element(row, row + c) - row) == y;
  }
  Tensor loss = Tensor::empty({b}), lse = Tensor::empty({b});
  ops::cross_entropy_forward(loss, lse, logits, targets, c);
  double sum = 0;
  for (int64_t i = 0; i < b; ++i)
    if (labels.data<int64_t>()[i] >= 0) sum += loss.data<float>()[i];
  const double n = static_cast<double>(std::max<int64_t>(counted, 1));
  if (dout) {
    Tensor dloss = Tensor::zeros({b});
    const double g = scale.loss_scale / (n * static_cast<double>(scale.microbatches));
    for (int64_t i = 0; i < b; ++i)
      if (labels.data<int64_t>()[i] >= 0) dloss.data<float>()[i] = static_cast<float>(g);
    Tensor dlogits = Tensor::empty({b, c});
    ops::cross_entropy_backward(dlogits, dloss, logits, lse, targets, c);
    dout->set(kLogits, dlogits);
  }
  LossTerms terms;
  // An all-padding micro-batch adds nothing (weight 0), so the logged mean is over real samples.
  terms.add("lm loss", counted ? sum / n : 0.0, counted ? 1.0 : 0.0);
  terms.add("accuracy", static_cast<double>(correct), static_cast<double>(counted));
  return terms;
}

LossTerms BertLoss::forward(const TensorMap& out, const TensorMap& batch,
                            const ObjectiveScale& scale, TensorMap* dout) const {
  MEGATRON_CHECK(!scale.per_token,
                 "--calculate-per-token-loss does not apply to BERT "
                 "(pretrain_bert.py averages each micro-batch's masked tokens); drop the flag");
  const Tensor& token_loss = out.at(kTokenLoss);
  const Tensor& mask = batch.at(kLossMask);
  const ops::MaskedSum masked = ops::masked_sum(token_loss, mask);
  const double count = std::max(masked.count, 1.0);
  const double lm = masked.sum / count;
  const auto m = static_cast<double>(scale.microbatches);
  if (dout) {
    Tensor d = mask.clone();
    ops::scale_inplace(d, scale.loss_scale / (count * m));
    dout->set(kTokenLoss, d);
  }
  LossTerms terms;
  terms.add("lm loss", lm, 1);
  if (const Tensor sop = out.get(kSopLoss); sop.defined()) {
    const int64_t b = sop.numel();
    const Tensor sop64 = sop.to(DType::kF64);
    double sum = 0;
    for (int64_t i = 0; i < b; ++i) sum += sop64.data<double>()[i];
    if (dout) {
      dout->set(kSopLoss, Tensor::full({b}, scale.loss_scale / (static_cast<double>(b) * m),
                                       sop.dtype(), sop.device()));
    }
    terms.add("sop loss", sum / static_cast<double>(b), 1);
  }
  return terms;
}

}  // namespace megatron
