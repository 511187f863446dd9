// LlavaModel stages behind the ModelChunk interface.
#include "models/llava/llava_chunk.h"

#include "data/gpt_batch.h"  // the batch field names

namespace megatron {

namespace {
constexpr const char* kHidden = "hidden";
constexpr const char* kTokenLoss = "per-token loss";  // what GPTLoss reads
}  // namespace

LlavaChunk::LlavaChunk(const TransformerConfig& cfg, GPTStage stage)
    : model_(cfg, std::move(stage)) {}

std::unique_ptr<ModelChunk::Ctx> LlavaChunk::new_ctx() const {
  return std::make_unique<LlavaCtx>();
}

std::vector<TensorSpec> LlavaChunk::recv_specs(int64_t micro_batch_size) const {
  if (model_.stage().pre_process) return {};
  return {
      TensorSpec{kHidden, model_.language_model.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<TensorSpec> LlavaChunk::send_specs(int64_t micro_batch_size) const {
  if (model_.stage().post_process) return {};
  return {
      TensorSpec{kHidden, model_.language_model.activation_shape(micro_batch_size), DType::kF32}};
}

std::vector<std::string> LlavaChunk::batch_fields() const {
  std::vector<std::string> fields;
  if (model_.stage().pre_process) fields.insert(fields.end(), {kTokens, kPositionIds, kImages});
  if (model_.stage().post_process) fields.insert(fields.end(), {kLabels, kLossMask});
  return fields;
}

TensorMap LlavaChunk::forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                              const ForwardMode& mode) const {
  const LlavaInputs inputs{batch.get(kTokens), batch.get(kPositionIds), batch.get(kImages),
                           batch.get(kLabels)};
  Tensor out =
      model_.forward_stage(in.get(kHidden), inputs, static_cast<LlavaCtx&>(ctx).model, mode);
  return TensorMap{{is_last() ? kTokenLoss : kHidden, out}};
}

TensorMap LlavaChunk::infer(const TensorMap& /*in*/, const TensorMap& batch,
                            const ForwardMode& mode, bool last_only) const {
  MEGATRON_CHECK(mode.kv_cache == nullptr,
                 "LLaVA generation runs without a KV cache (megatron generate --model llava)");
  const LlavaInputs inputs{batch.get(kTokens), batch.get(kPositionIds), batch.get(kImages),
                           Tensor()};
  return TensorMap{{"logits", model_.infer(inputs, last_only)}};
}

TensorMap LlavaChunk::backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const {
  const Tensor& d = dout.at(is_last() ? kTokenLoss : kHidden);
  Tensor dx = model_.backward_stage(d, static_cast<LlavaCtx&>(ctx).model, done);
  if (model_.stage().pre_process) return {};
  return TensorMap{{kHidden, dx}};
}

}  // namespace megatron
