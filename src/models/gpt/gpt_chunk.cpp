// GPTModel stages behind the ModelChunk interface, and the masked LM loss.
#include "models/gpt/gpt_chunk.h"

#include <algorithm>

#include "models/gpt/mtp.h"
#include "tensor/ops.h"

namespace megatron {

namespace {
constexpr const char* kHidden = "hidden";
constexpr const char* kTokenLoss = "per-token loss";
constexpr const char* kLogits = "logits";
}  // namespace

GPTChunk::GPTChunk(const TransformerConfig& cfg, GPTStage stage, bool documents, bool packed)
    : model_(cfg, std::move(stage)), documents_(documents || packed), packed_(packed) {}

std::unique_ptr<ModelChunk::Ctx> GPTChunk::new_ctx() const {
  return std::make_unique<GPTCtx>();
}

std::vector<TensorSpec> GPTChunk::recv_specs(int64_t micro_batch_size) const {
  if (model_.stage().pre_process) return {};
  return {TensorSpec{kHidden, model_.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<TensorSpec> GPTChunk::send_specs(int64_t micro_batch_size) const {
  if (model_.stage().post_process) return {};
  return {TensorSpec{kHidden, model_.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<std::string> GPTChunk::batch_fields() const {
  std::vector<std::string> fields;
  if (model_.stage().pre_process) fields.insert(fields.end(), {kTokens, kPositionIds});
  if (model_.stage().post_process) fields.insert(fields.end(), {kLabels, kLossMask});
  // Multi-token prediction embeds the tokens again on the last stage.
  if (model_.mtp && !model_.stage().pre_process) fields.emplace_back(kTokens);
  if (documents_) fields.emplace_back(kDocStart);
  return fields;
}

std::string mtp_loss_name(int64_t k) {
  return "mtp_" + std::to_string(k) + " per-token loss";
}

std::string mtp_mask_name(int64_t k) {
  return "mtp_" + std::to_string(k) + " loss mask";
}

std::string mtp_count_name(int64_t k) {
  return "mtp_" + std::to_string(k) + " token count";
}

TensorMap GPTChunk::forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                            const ForwardMode& mode) const {
  const GPTInputs inputs{batch.get(kTokens),   batch.get(kLabels), batch.get(kPositionIds),
                         batch.get(kDocStart), Tensor(),           packed_};
  GPTModel::Ctx& mctx = static_cast<GPTCtx&>(ctx).model;
  Tensor out = model_.forward_stage(in.get(kHidden), inputs, mctx, mode);
  TensorMap result{{is_last() ? kTokenLoss : kHidden, out}};
  Tensor mask = mctx.mtp_losses.empty() ? Tensor() : batch.get(kLossMask);
  for (size_t k = 0; k < mctx.mtp_losses.size(); ++k) {
    result.set(mtp_loss_name(static_cast<int64_t>(k) + 1), mctx.mtp_losses[k]);
    // Under context parallelism the loss mask rolls across the ranks' chunks here (collective),
    // with packed documents inside each document; GPTLoss rolls it itself otherwise.
    const ContextParallelContext& cp = model_.mtp->cp();
    const Tensor& ends = mctx.mtp.ends;
    if (!mask.defined() || !(cp.enabled() || ends.defined())) continue;
    mask = roll_left(mask, cp, ends);
    result.set(mtp_mask_name(static_cast<int64_t>(k) + 1), mask);
    if (cp.enabled()) {
      // The depth's mean is over the whole sequence's rolled tokens, which the CP ranks hold
      // unevenly (the last k positions are on one rank): each rank normalises by the global
      // count / cp, so that the gradients averaged over CP are one process's.
      Tensor count = Tensor::full({1}, ops::masked_sum(mask, mask).count, DType::kF64);
      cp.group->all_reduce(count);
      count.data<double>()[0] /= static_cast<double>(cp.size());
      result.set(mtp_count_name(static_cast<int64_t>(k) + 1), count);
    }
  }
  return result;
}

TensorMap GPTChunk::backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const {
  const Tensor& d = dout.at(is_last() ? kTokenLoss : kHidden);
  GPTModel::Ctx& mctx = static_cast<GPTCtx&>(ctx).model;
  mctx.mtp_dlosses.clear();
  for (size_t k = 0; k < mctx.mtp_losses.size(); ++k)
    mctx.mtp_dlosses.push_back(dout.at(mtp_loss_name(static_cast<int64_t>(k) + 1)));
  Tensor dx = model_.backward_stage(d, mctx, done);
  if (model_.stage().pre_process) return {};
  return TensorMap{{kHidden, dx}};
}

TensorMap GPTChunk::infer(const TensorMap& in, const TensorMap& batch, const ForwardMode& mode,
                          bool last_only) const {
  Tensor out = model_.infer_stage(in.get(kHidden), batch.get(kTokens), batch.get(kPositionIds),
                                  mode, last_only);
  return TensorMap{{is_last() ? kLogits : kHidden, out}};
}

std::vector<TensorSpec> GPTChunk::infer_specs(int64_t b, int64_t s) const {
  return {TensorSpec{kHidden, Shape{s, b, model_.config().hidden_size}, DType::kF32}};
}

LossTerms GPTLoss::forward(const TensorMap& out, const TensorMap& batch,
                           const ObjectiveScale& scale, TensorMap* dout) const {
  const Tensor& loss = out.at(kTokenLoss);
  const Tensor& mask = batch.at(kLossMask);
  const ops::MaskedSum masked = ops::masked_sum(loss, mask);
  const double sum = masked.sum, count = masked.count;
  if (dout) {
    Tensor dloss = mask.clone();
    const auto m = static_cast<double>(scale.microbatches);
    ops::scale_inplace(
        dloss, scale.per_token ? scale.loss_scale : scale.loss_scale / (std::max(count, 1.0) * m));
    dout->set(kTokenLoss, dloss);
  }
  LossTerms terms;
  terms.add("lm loss", sum, count);
  if (!dout || mtp_depths_ == 0) return terms;
  Tensor rolled = mask;
  for (int64_t k = 1; k <= mtp_depths_; ++k) {
    rolled = out.find(mtp_mask_name(k)) ? out.at(mtp_mask_name(k)) : roll_left(rolled);
    const Tensor& depth_loss = out.at(mtp_loss_name(k));
    ops::MaskedSum m = ops::masked_sum(depth_loss, rolled);
    if (const Tensor* global = out.find(mtp_count_name(k))) m.count = global->item();
    Tensor d = rolled.clone();
    const double weight = mtp_scale_ / static_cast<double>(mtp_depths_);
    const auto mb = static_cast<double>(scale.microbatches);
    ops::scale_inplace(
        d, weight * (scale.per_token ? scale.loss_scale
                                     : scale.loss_scale / (std::max(m.count, 1.0) * mb)));
    dout->set(mtp_loss_name(k), d);
    terms.add("mtp_" + std::to_string(k) + " loss", m.sum, m.count);
  }
  return terms;
}

std::vector<Fp8Region*> GPTChunk::fp8_regions() {
  // The decoder's, then the prediction depths' (last stage).
  std::vector<Fp8Region*> out;
  if (Fp8Region* r = model_.decoder->fp8_region()) out.push_back(r);
  if (model_.mtp) {
    for (Fp8Region* r : model_.mtp->fp8_regions()) out.push_back(r);
  }
  return out;
}

std::vector<SelfAttention*> GPTChunk::decoder_self_attentions() {
  return model_.decoder->self_attentions();
}

std::vector<TopKRouter*> GPTChunk::moe_routers() {
  std::vector<TopKRouter*> out;
  for (auto& layer : model_.decoder->layers)
    if (layer->moe) out.push_back(&layer->moe->router);
  if (model_.mtp)
    for (auto& depth : model_.mtp->layers)
      for (auto& layer : depth->layers)
        if (layer->moe) out.push_back(&layer->moe->router);
  return out;
}

}  // namespace megatron
