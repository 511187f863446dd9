// LLaVA's spec: see the header.
#include "models/llava/llava_spec.h"

#include "core/error.h"
#include "models/gpt/gpt_chunk.h"  // GPTLoss
#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_memory.h"
#include "models/gpt/gpt_spec.h"  // gpt_stage
#include "models/llava/llava_chunk.h"
#include "models/llava/llava_data.h"
#include "models/llava/llava_hf.h"

namespace megatron {

namespace {

std::vector<std::unique_ptr<ModelChunk>> build_chunks(const ModelOptions& o,
                                                      const ChunkPlacement& p) {
  MEGATRON_CHECK(!o.reset_attention_mask,
                 "--reset-attention-mask applies to GPT documents, not to image-text samples");
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (const ChunkLayers& l : chunk_layers(o.config.num_layers, p))
    chunks.push_back(std::make_unique<LlavaChunk>(o.config, gpt_stage(p, l)));
  return chunks;
}

const LlavaModel& llava(const ModelChunk& chunk) {
  const auto* c = dynamic_cast<const LlavaChunk*>(&chunk);
  MEGATRON_ASSERT(c != nullptr, "a LLaVA spec function was given another model's chunk");
  return c->model();
}

// Megatron's formula for the language model over the combined sequence, plus the vision
// encoder's layers over its own (no output layer), its patch GEMM and the projector: all at
// 6 FLOPs per multiply-add and parameter-token (forward, data and weight gradients), frozen parts
// included (model FLOPs, the numerator of MFU).
double flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size) {
  const double lm = model_flops_per_iteration(cfg, global_batch_size);
  TransformerConfig v = vision_transformer_config(cfg);
  v.padded_vocab_size = 0;
  const double vit = model_flops_per_iteration(v, global_batch_size);
  const VisionConfig& vc = cfg.vision;
  const auto b = static_cast<double>(global_batch_size);
  const double patches = static_cast<double>(vc.num_patches());
  const double hv = static_cast<double>(v.hidden_size), h = static_cast<double>(cfg.hidden_size);
  const double stem =
      6.0 * b * patches * 3.0 * static_cast<double>(vc.patch_dim * vc.patch_dim) * hv;
  const double ffn = static_cast<double>(
      vc.projection_ffn_hidden_size > 0 ? vc.projection_ffn_hidden_size : cfg.hidden_size);
  const double per_token = vc.projection_type == "affine" ? hv * h : hv * ffn + ffn * h;
  const double projector = 6.0 * b * static_cast<double>(vc.num_image_embeddings()) * per_token;
  return lm + vit + stem + projector;
}

int64_t activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg, int64_t mbs) {
  const LlavaModel& m = llava(chunk);
  const GPTStage& st = m.stage();
  const int tp = st.tp ? st.tp->size() : 1;
  int64_t bytes = activation_bytes_per_microbatch(
      cfg, ActivationShape{.micro_batch_size = mbs,
                           .tp = tp,
                           .sequence_parallel = st.sequence_parallel && tp > 1,
                           .num_layers = st.num_layers,
                           .first_layer = st.first_layer,
                           .pre_process = st.pre_process,
                           .post_process = st.post_process,
                           .cp = st.cp.size()});
  if (m.vision_model) {  // one image per sample; its layers as a block without heads
    bytes += activation_bytes_per_microbatch(m.vision_model->config(),
                                             ActivationShape{.micro_batch_size = mbs,
                                                             .tp = tp,
                                                             .num_layers = cfg.vision.num_layers,
                                                             .pre_process = false,
                                                             .post_process = false});
  }
  return bytes;
}

ModelSpec make_llava_spec() {
  ModelSpec s;
  s.name = "llava";
  s.entry_point = "pretrain_vlm";
  s.summary =
      "LLaVA vision-language model: CLIP ViT + projector + GPT/Llama decoder (Megatron's "
      "pretrain_vlm.py)";
  s.build_chunks = build_chunks;
  s.make_loss = [](const TransformerConfig&) { return std::make_unique<GPTLoss>(); };
  s.batch_field = llava_batch_field;
  s.batch_maker = llava_batch_maker;
  s.build_datasets = llava_datasets;
  s.flops_per_iteration = flops_per_iteration;
  s.activation_bytes = activation_bytes;
  s.hf = llava_hf_mapping();
  s.token_losses = [](const ModelChunk&, const Tensor&, const Tensor&) -> Tensor {
    MEGATRON_CHECK(false,
                   "`megatron score` reads text only; a LLaVA model needs its images: score "
                   "image-text data with `megatron evaluate`-style validation "
                   "(--eval-iters) instead");
    return Tensor();
  };
  return s;
}

}  // namespace

const ModelSpec& llava_spec() {
  static const ModelSpec spec = make_llava_spec();
  return spec;
}

}  // namespace megatron
