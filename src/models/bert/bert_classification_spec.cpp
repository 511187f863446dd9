// The BERT classifier's spec: see the header.
#include "models/bert/bert_classification_spec.h"

#include "core/error.h"
#include "core/logging.h"
#include "data/classification_dataset.h"
#include "models/bert/bert_chunk.h"
#include "models/bert/bert_hf.h"
#include "models/gpt/gpt_flops.h"

namespace megatron {

namespace {

Datasets classification_datasets(const DataConfig& a, const Tokenizer& tokenizer,
                                 int64_t seq_length, const SampleCounts& n, bool log) {
  MEGATRON_CHECK(!a.task.empty() && !a.train_data.empty(),
                 "finetuning needs --task and --train-data (use `megatron finetune`)");
  const ClassificationTask task = classification_task(a.task);
  const auto train = read_classification_examples(task, a.train_data, "--train-data");
  const std::vector<std::string> labels = classification_labels(task, train);
  Datasets d;
  if (log) {
    log_line(" > building " + task.name + " datasets: " + std::to_string(train.size()) +
             " training examples, " + std::to_string(labels.size()) + " classes");
  }
  d.train = std::make_unique<ClassificationDataset>(train, labels, tokenizer, seq_length, true,
                                                    n.train, a.eval_batch,
                                                    static_cast<uint32_t>(a.seed), "--train-data");
  if (!a.valid_data.empty()) {
    const auto valid = read_classification_examples(task, a.valid_data, "--valid-data");
    auto v = std::make_unique<ClassificationDataset>(valid, labels, tokenizer, seq_length, false,
                                                     n.valid, a.eval_batch,
                                                     static_cast<uint32_t>(a.seed), "--valid-data");
    if (log) log_line(" > validation: " + std::to_string(v->num_examples()) + " examples");
    d.valid = std::move(v);
  }
  return d;
}

BatchFn classification_batch_maker(const DataConfig&, const Tokenizer&) {
  return [](const SampleSource& data, int64_t first, int64_t b) {
    const int64_t s = data.seq_length();
    MEGATRON_CHECK(data.sample_width() == ClassificationRecord::width(s),
                   "classification batches need classification samples");
    Tensor tokens = Tensor::empty({b, s}, DType::kI64), types = Tensor::empty({b, s}, DType::kI64);
    Tensor padding = Tensor::empty({b, s}, DType::kI32), label = Tensor::empty({b}, DType::kI64);
    std::vector<int64_t> rec(static_cast<size_t>(data.sample_width()));
    for (int64_t i = 0; i < b; ++i) {
      data.sample(first + i, rec.data());
      const ClassificationRecord r(rec.data(), s);
      for (int64_t t = 0; t < s; ++t) {
        tokens.data<int64_t>()[i * s + t] = r.text[t];
        types.data<int64_t>()[i * s + t] = r.types[t];
        padding.data<int32_t>()[i * s + t] = r.padding_mask[t] == 1 ? 1 : 0;
      }
      label.data<int64_t>()[i] = r.label;
    }
    return TensorMap{
        {"tokens", tokens}, {kBertTypes, types}, {kBertPaddingMask, padding}, {kClassLabel, label}};
  };
}

// Hugging Face BERT directories start a classifier: the encoder, embeddings and pooler load, the
// pretraining heads are left out and the classification head keeps its initialisation.
HfMapping hf_mapping() {
  HfMapping h;
  h.read_config = [](const std::string& dir) { return read_bert_hf_config(dir).config; };
  h.load = [](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    auto* chunk = dynamic_cast<BertChunk*>(&whole);
    MEGATRON_ASSERT(chunk != nullptr, "the classifier spec was given another model's chunk");
    load_bert_hf_encoder(dir, read_bert_hf_config(dir), chunk->model(), params);
  };
  h.save = [](const std::string&, const ModelChunk&, const std::string&, std::optional<DType>) {
    MEGATRON_CHECK(false,
                   "a finetuned BERT classifier has no Hugging Face pretraining form to "
                   "export to (--save-hf); save a checkpoint with --save instead");
  };
  h.check_exportable = [](const TransformerConfig&) {
    MEGATRON_CHECK(false, "--save-hf does not apply to a BERT classifier; use --save");
  };
  return h;
}

ModelSpec make_spec() {
  ModelSpec s;
  s.name = "bert_classification";
  s.entry_point = "finetune";
  s.summary = "BERT sequence classifier (Megatron's tasks/main.py finetuning; megatron finetune)";
  s.build_chunks = [](const ModelOptions& o, const ChunkPlacement& p) {
    MEGATRON_CHECK(o.config.num_classes >= 2, "a BERT classifier needs at least two classes");
    return build_bert_chunks(o, p, o.config.num_classes);
  };
  s.make_loss = [](const TransformerConfig&) -> std::unique_ptr<LossFn> {
    return std::make_unique<ClassificationLoss>();
  };
  s.batch_field = [](const std::string& name, int64_t b, const TransformerConfig& cfg) {
    const int64_t seq = cfg.seq_length;
    const Shape shape = name == kClassLabel ? Shape{b} : Shape{b, seq};
    return TensorSpec{name, shape, bert_batch_field_dtype(name)};
  };
  s.batch_maker = classification_batch_maker;
  s.build_datasets = classification_datasets;
  s.flops_per_iteration = model_flops_per_iteration;
  s.activation_bytes = bert_activation_bytes;
  s.hf = hf_mapping();
  s.token_losses = [](const ModelChunk&, const Tensor&, const Tensor&) -> Tensor {
    MEGATRON_CHECK(false, "`megatron score` applies to GPT models, not to a BERT classifier");
    return Tensor();
  };
  return s;
}

}  // namespace

const ModelSpec& bert_classification_spec() {
  static const ModelSpec spec = make_spec();
  return spec;
}

}  // namespace megatron
