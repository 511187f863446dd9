// BERT's spec: see the header.
#include "models/bert/bert_spec.h"

#include "core/error.h"
#include "models/bert/bert_chunk.h"
#include "models/bert/bert_data.h"
#include "models/bert/bert_hf.h"
#include "models/common/hf_tensors.h"
#include "models/gpt/gpt_flops.h"

namespace megatron {

namespace {

const BertModel& bert(const ModelChunk& chunk) {
  const auto* b = dynamic_cast<const BertChunk*>(&chunk);
  MEGATRON_ASSERT(b != nullptr, "a BERT spec function was given another model's chunk");
  return b->model();
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
      info.raw["torch_dtype"] = torch_dtype_name(*dtype);
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
  s.build_chunks = [](const ModelOptions& o, const ChunkPlacement& p) {
    return build_bert_chunks(o, p, /*num_classes=*/0);
  };
  s.make_loss = [](const TransformerConfig&) -> std::unique_ptr<LossFn> {
    return std::make_unique<BertLoss>();
  };
  s.batch_field = [](const std::string& name, int64_t b, const TransformerConfig& cfg) {
    const int64_t seq = cfg.seq_length;
    const Shape shape = name == kBertIsRandom ? Shape{b} : Shape{b, seq};
    return TensorSpec{name, shape, bert_batch_field_dtype(name)};
  };
  s.batch_maker = bert_batch_maker;
  s.build_datasets = bert_datasets;
  s.flops_per_iteration = model_flops_per_iteration;
  s.activation_bytes = bert_activation_bytes;
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
