// T5Chunk: the whole T5 model as the trainer's one chunk; its batch fields and memory estimate.
#include "models/t5/t5_chunk.h"

#include "core/error.h"
#include "data/gpt_batch.h"  // kLabels, kLossMask
#include "models/gpt/gpt_memory.h"

namespace megatron {

namespace {
constexpr const char* kTokenLoss = "per-token loss";  // GPTLoss's input
}  // namespace

TensorSpec t5_batch_field(const std::string& name, int64_t b, const TransformerConfig& cfg) {
  const int64_t enc = cfg.seq_length, dec = cfg.decoder_seq_length;
  if (name == kT5TextEnc) return TensorSpec{name, Shape{b, enc}, DType::kI64};
  if (name == kT5EncMask) return TensorSpec{name, Shape{b, enc}, DType::kI32};
  if (name == kT5TextDec || name == kLabels) return TensorSpec{name, Shape{b, dec}, DType::kI64};
  if (name == kT5DecMask) return TensorSpec{name, Shape{b, dec}, DType::kI32};
  if (name == kLossMask) return TensorSpec{name, Shape{b, dec}, DType::kF32};
  MEGATRON_CHECK(false, "'", name, "' is not a T5 batch field");
  return {};
}

std::vector<std::unique_ptr<ModelChunk>> build_t5_chunks(const ModelOptions& o,
                                                         const ChunkPlacement& p) {
  MEGATRON_CHECK(p.pp_size == 1 && p.virtual_stages == 1,
                 "pipeline parallelism is not supported for T5 (Megatron r0.14 removed it): "
                 "use --pipeline-model-parallel-size 1");
  MEGATRON_CHECK(!p.cp.enabled(), "T5 has no context-parallel form: use --context-parallel-size 1");
  MEGATRON_CHECK(!o.config.moe.enabled(),
                 "T5 with MoE layers is not supported: drop --num-experts");
  MEGATRON_CHECK(!o.reset_attention_mask, "--reset-attention-mask does not apply to T5");
  std::vector<std::unique_ptr<ModelChunk>> out;
  out.push_back(std::make_unique<T5Chunk>(o.config, p.tp, p.sequence_parallel, p.amax));
  return out;
}

int64_t t5_activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg,
                            int64_t micro_batch_size) {
  const auto* c = dynamic_cast<const T5Chunk*>(&chunk);
  MEGATRON_ASSERT(c != nullptr, "a T5 spec function was given another model's chunk");
  const TensorParallelContext& tpc = c->model().tensor_parallel();
  const TransformerConfig dec = t5_decoder_config(cfg);
  const int tp = tpc.size();
  ActivationShape shape{.micro_batch_size = micro_batch_size,
                        .tp = tp,
                        .sequence_parallel = tpc.sp(),
                        .num_layers = cfg.num_layers};
  shape.post_process = false;
  const int64_t encoder = activation_bytes_per_microbatch(cfg, shape);
  shape.num_layers = dec.num_layers;
  shape.post_process = true;
  const int64_t decoder = activation_bytes_per_microbatch(dec, shape);
  // Each decoder layer's cross-attention keeps its norm's input and statistics, the query GEMM's
  // input, the query, the packed keys and values of the encoder's output, the output and lse.
  const int64_t b = micro_batch_size, h = cfg.hidden_size, e = 4;
  const int64_t sd = dec.seq_length, se = cfg.seq_length, heads = cfg.num_attention_heads;
  const int64_t qdim = heads * cfg.head_dim();
  const int64_t cross = sd * b * (2 * h + 2) * e + sd * b * qdim * 2 / tp * e +
                        se * b * 2 * qdim / tp * e + se * b * h * e + b * heads / tp * sd * e;
  return encoder + decoder + dec.num_layers * cross;
}

T5Chunk::T5Chunk(const TransformerConfig& cfg, std::shared_ptr<ProcessGroup> tp,
                 bool sequence_parallel, ProcessGroup* amax)
    : model_(cfg, std::move(tp), sequence_parallel, amax) {}

std::unique_ptr<ModelChunk::Ctx> T5Chunk::new_ctx() const {
  return std::make_unique<T5Ctx>();
}

std::vector<std::string> T5Chunk::batch_fields() const {
  return {kT5TextEnc, kT5TextDec, kLabels, kLossMask, kT5EncMask, kT5DecMask};
}

TensorMap T5Chunk::forward(const TensorMap&, const TensorMap& batch, Ctx& ctx,
                           const ForwardMode& mode) const {
  const T5Inputs in{batch.at(kT5TextEnc), batch.at(kT5TextDec), batch.get(kT5EncMask),
                    batch.get(kT5DecMask), batch.at(kLabels)};
  return TensorMap{{kTokenLoss, model_.forward(in, static_cast<T5Ctx&>(ctx).model, mode)}};
}

TensorMap T5Chunk::backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const {
  model_.backward(dout.at(kTokenLoss), static_cast<T5Ctx&>(ctx).model, done);
  return {};
}

}  // namespace megatron
