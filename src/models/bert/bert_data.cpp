// BERT datasets per split and BERT micro-batches.
#include "models/bert/bert_data.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/bert_dataset.h"
#include "data/gpt_batch.h"
#include "data/indexed_dataset.h"
#include "models/bert/bert_chunk.h"
#include "models/common/sentence_datasets.h"

namespace megatron {

Datasets bert_datasets(const DataConfig& a, const Tokenizer& tokenizer, int64_t seq_length,
                       const SampleCounts& n, bool log) {
  BertDatasetConfig config;
  config.random_seed = a.seed;
  config.sequence_length = seq_length;
  config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  config.path_to_cache = a.data_cache_path;
  config.short_sequence_probability = a.short_seq_prob;
  config.masking.masking_probability = a.mask_prob;
  config.classification_head = a.bert_binary_head;
  config.log = log;
  return sentence_datasets(
      a, n, "BERT",
      [&](std::shared_ptr<const IndexedDataset> data, DocumentRange documents, int64_t count,
          Split which, const std::optional<std::string>& split) -> std::unique_ptr<SampleSource> {
        BertDatasetConfig c = config;
        c.split = split;
        return std::make_unique<BertDataset>(std::move(data), documents, count, which, c,
                                             tokenizer);
      },
      log);
}

BatchFn bert_batch_maker(const DataConfig& config, const Tokenizer& tokenizer) {
  masking_vocab(tokenizer);  // refuses a tokenizer without BERT's special tokens, before training
  const bool binary_head = config.bert_binary_head;
  return [binary_head](const SampleSource& data, int64_t first, int64_t b) {
    const int64_t s = data.seq_length(), width = data.sample_width();
    MEGATRON_CHECK(width == BertRecord::width(s), "BERT batches need BERT samples");
    Tensor tokens = Tensor::empty({b, s}, DType::kI64), types = Tensor::empty({b, s}, DType::kI64);
    Tensor labels = Tensor::empty({b, s}, DType::kI64);
    Tensor padding = Tensor::empty({b, s}, DType::kI32);
    Tensor loss_mask = Tensor::empty({b, s}, DType::kF32);
    Tensor is_random = Tensor::empty({b}, DType::kI64);
    std::vector<int64_t> record(static_cast<size_t>(width));
    for (int64_t i = 0; i < b; ++i) {
      data.sample(first + i, record.data());
      const BertRecord r(record.data(), s);
      for (int64_t t = 0; t < s; ++t) {
        tokens.data<int64_t>()[i * s + t] = r.text[t];
        types.data<int64_t>()[i * s + t] = r.types[t];
        labels.data<int64_t>()[i * s + t] = r.labels[t];
        // Megatron pads the mask with the pad id (0 in BERT vocabularies): real tokens are 1.
        padding.data<int32_t>()[i * s + t] = r.padding_mask[t] == 1 ? 1 : 0;
        loss_mask.data<float>()[i * s + t] = static_cast<float>(r.loss_mask[t]);
      }
      is_random.data<int64_t>()[i] = r.is_random;
    }
    TensorMap m{
        {kTokens, tokens}, {kBertPaddingMask, padding}, {kLabels, labels}, {kLossMask, loss_mask}};
    if (binary_head) {
      m.set(kBertTypes, types);
      m.set(kBertIsRandom, is_random);
    }
    return m;
  };
}

}  // namespace megatron
