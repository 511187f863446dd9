// BERT's spec: see the header.
#include "models/bert/bert_spec.h"

#include "core/error.h"
#include "models/bert/bert_chunk.h"
#include "models/bert/bert_data.h"
#include "models/bert/bert_hf.h"
#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_memory.h"

namespace megatron {

namespace {

// Chunk c of pipeline rank r is virtual stage c * pp + r, as GPT's.
std::vector<std::unique_ptr<ModelChunk>> build_chunks(const ModelOptions& o,
                                                      const ChunkPlacement& p) {
  MEGATRON_CHECK(!p.cp.enabled(), "BERT attends both ways: --context-parallel-size must be 1");
  MEGATRON_CHECK(!o.config.moe.enabled(),
                 "BERT with Mixture-of-Experts layers is not supported; "
                 "drop --num-experts");
  MEGATRON_CHECK(!o.reset_attention_mask,
                 "--reset-attention-mask applies to GPT documents, not "
                 "to BERT's sentence pairs; drop it");
  const int64_t stages = static_cast<int64_t>(p.pp_size) * p.virtual_stages;
  const int64_t per_stage = o.config.num_layers / stages;
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (int c = 0; c < p.virtual_stages; ++c) {
    const int64_t g = static_cast<int64_t>(c) * p.pp_size + p.pp_rank;
    const BertStage stage{.tp = p.tp,
                          .sequence_parallel = p.sequence_parallel,
                          .first_layer = g * per_stage,
                          .num_layers = per_stage,
                          .pre_process = g == 0,
                          .post_process = g == stages - 1,
                          .binary_head = o.config.bert_binary_head};
    chunks.push_back(std::make_unique<BertChunk>(o.config, stage));
  }
  return chunks;
}

const BertModel& bert(const ModelChunk& chunk) {
  const auto* b = dynamic_cast<const BertChunk*>(&chunk);
  MEGATRON_ASSERT(b != nullptr, "a BERT spec function was given another model's chunk");
  return b->model();
}

int64_t activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg, int64_t mbs) {
  const BertStage& st = bert(chunk).stage();
  const int tp = st.tp ? st.tp->size() : 1;
  // The encoder's layers keep what GPT's decoder layers keep; the heads add a few [s, b, h].
  const ActivationShape shape{.micro_batch_size = mbs,
                              .tp = tp,
                              .sequence_parallel = st.sequence_parallel && tp > 1,
                              .num_layers = st.num_layers,
                              .first_layer = st.first_layer,
                              .pre_process = st.pre_process,
                              .post_process = st.post_process,
                              .cp = 1};
  return activation_bytes_per_microbatch(cfg, shape);
}

HfMapping hf_mapping() {
  HfMapping h;
  h.read_config = [](const std::string& dir) { return read_bert_hf_config(dir).config; };
  h.load = [](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    load_bert_hf_weights(dir, read_bert_hf_config(dir), const_cast<BertModel&>(bert(whole)),
                         params);
  };
  h.save = [](const std::string& dir, const ModelChunk& whole, const std::string& source_dir,
              std::optional<DType> dtype) {
    const BertModel& m = bert(whole);
    BertHfInfo info =
        source_dir.empty() ? bert_hf_info_from_config(m.config()) : read_bert_hf_config(source_dir);
    if (dtype) {
      info.dtype = *dtype;
      info.raw["torch_dtype"] = *dtype == DType::kBF16  ? "bfloat16"
                                : *dtype == DType::kF16 ? "float16"
                                                        : "float32";
    }
    save_bert_hf(dir, info, m);
  };
  h.check_exportable = check_bert_exportable;
  return h;
}

ModelSpec make_bert_spec() {
  ModelSpec s;
  s.name = "bert";
  s.entry_point = "pretrain_bert";
  s.summary = "BERT encoder with masked-LM and sentence-order heads (Megatron's pretrain_bert.py)";
  s.build_chunks = build_chunks;
  s.make_loss = []() -> std::unique_ptr<LossFn> { return std::make_unique<BertLoss>(); };
  s.batch_field = [](const std::string& name, int64_t b, int64_t seq) {
    const Shape shape = name == kBertIsRandom ? Shape{b} : Shape{b, seq};
    return TensorSpec{name, shape, bert_batch_field_dtype(name)};
  };
  s.batch_maker = bert_batch_maker;
  s.build_datasets = bert_datasets;
  s.flops_per_iteration = model_flops_per_iteration;
  s.activation_bytes = activation_bytes;
  s.hf = hf_mapping();
  s.token_losses = [](const ModelChunk&, const Tensor&, const Tensor&) -> Tensor {
    MEGATRON_CHECK(false,
                   "BERT is not a left-to-right language model: `megatron score` and "
                   "`megatron generate` apply to GPT models");
    return Tensor();
  };
  return s;
}

}  // namespace

const ModelSpec& bert_spec() {
  static const ModelSpec spec = make_bert_spec();
  return spec;
}

}  // namespace megatron
