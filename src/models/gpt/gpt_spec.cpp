// GPT's spec: GPTChunk stages, GPTLoss, GPTBatch fields, Megatron's GPT FLOPs formula, the
// activation estimate, the GPT-2/Llama Hugging Face mapping and scoring.
#include "models/gpt/gpt_spec.h"

#include "models/gpt/gpt_chunk.h"
#include "models/gpt/gpt_data.h"
#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_hf.h"
#include "models/gpt/gpt_memory.h"

namespace megatron {

namespace {

std::vector<std::unique_ptr<ModelChunk>> build_chunks(const ModelOptions& o,
                                                      const ChunkPlacement& p) {
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (const ChunkLayers& l : chunk_layers(o.config.num_layers, p))
    chunks.push_back(std::make_unique<GPTChunk>(o.config, gpt_stage(p, l), o.reset_attention_mask,
                                                o.packed_documents));
  return chunks;
}

int64_t activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg, int64_t mbs) {
  const GPTModel& m = gpt_model_of(chunk);
  const GPTStage& st = m.stage();
  const int tp = st.tp ? st.tp->size() : 1;
  const ActivationShape shape{
      .micro_batch_size = mbs,
      .tp = tp,
      .sequence_parallel = st.sequence_parallel && tp > 1,
      // The last stage runs every MTP depth's layers after its own (numbered after the
      // decoder's, as activation_bytes_per_microbatch walks them; a repeated block's
      // applications each keep their own).
      .num_layers =
          st.num_layers +
          (st.post_process && m.mtp ? cfg.mtp_num_layers * cfg.mtp_layers_per_depth() : 0),
      .first_layer = st.first_layer,
      .pre_process = st.pre_process,
      .post_process = st.post_process,
      .cp = st.cp.size()};
  return activation_bytes_per_microbatch(cfg, shape);
}

HfMapping hf_mapping() {
  HfMapping h;
  h.read_config = [](const std::string& dir) { return read_hf_config(dir).config; };
  h.load = [](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    const HfModelInfo info = read_hf_config(dir);
    load_hf_weights(dir, info, const_cast<GPTModel&>(gpt_model_of(whole)), params);
  };
  h.save = [](const std::string& dir, const ModelChunk& whole, const std::string& source_dir,
              std::optional<DType> dtype) {
    const GPTModel& m = gpt_model_of(whole);
    HfModelInfo info = source_dir.empty()
                           ? hf_info_from_config(m.config(), infer_hf_arch(m.config()))
                           : read_hf_config(source_dir);
    if (dtype) {
      info.dtype = *dtype;
      info.raw["torch_dtype"] = torch_dtype_name(*dtype);
    }
    save_hf(dir, info, m);
  };
  h.check_exportable = [](const TransformerConfig& cfg) { infer_hf_arch(cfg); };
  return h;
}

Tensor token_losses(const ModelChunk& whole, const Tensor& tokens, const Tensor& labels) {
  GPTModel::Ctx ctx;
  return gpt_model_of(whole).forward(tokens, labels, Tensor(), ctx, ForwardMode{});
}

ModelSpec make_gpt_spec() {
  ModelSpec s;
  s.name = "gpt";
  s.entry_point = "pretrain_gpt";
  s.summary = "GPT-2 or Llama style decoder (Megatron's pretrain_gpt.py)";
  s.build_chunks = build_chunks;
  s.make_loss = [](const TransformerConfig& cfg) { return std::make_unique<GPTLoss>(cfg); };
  s.batch_field = [](const std::string& name, int64_t b, const TransformerConfig& cfg) {
    const int64_t seq = cfg.seq_length;
    return TensorSpec{name, Shape{b, seq}, gpt_batch_field_dtype(name)};
  };
  s.batch_maker = gpt_batch_maker;
  s.build_datasets = gpt_datasets;
  s.flops_per_iteration = model_flops_per_iteration;
  s.activation_bytes = activation_bytes;
  s.hf = hf_mapping();
  s.token_losses = token_losses;
  return s;
}

}  // namespace

const GPTModel& gpt_model_of(const ModelChunk& chunk) {
  const auto* g = dynamic_cast<const GPTChunk*>(&chunk);
  MEGATRON_ASSERT(g != nullptr, "a GPT spec function was given another model's chunk");
  return g->model();
}

GPTStage gpt_stage(const ChunkPlacement& p, const ChunkLayers& l) {
  return GPTStage{.tp = p.tp,
                  .sequence_parallel = p.sequence_parallel,
                  .first_layer = l.first_layer,
                  .num_layers = l.num_layers,
                  .pre_process = l.pre_process,
                  .post_process = l.post_process,
                  .cp = p.cp,
                  .expert = p.expert,
                  .amax = p.amax};
}

const ModelSpec& gpt_spec() {
  static const ModelSpec spec = make_gpt_spec();
  return spec;
}

}  // namespace megatron
