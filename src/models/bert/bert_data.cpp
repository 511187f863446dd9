// BERT datasets per split and BERT micro-batches.
#include "models/bert/bert_data.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/bert_dataset.h"
#include "data/gpt_batch.h"
#include "data/indexed_dataset.h"
#include "models/bert/bert_chunk.h"

namespace megatron {

namespace {

// The one prefix of a --data-path style list ("prefix" or "weight prefix"); blends of several
// BERT datasets are not built here.
std::string single_prefix(const std::vector<std::string>& args, const char* flag) {
  std::vector<std::string> tokens;
  for (const std::string& a : args) {
    std::istringstream in(a);
    for (std::string t; in >> t;) tokens.push_back(t);
  }
  if (tokens.empty()) return "";
  MEGATRON_CHECK(tokens.size() == 1 || tokens.size() == 2, flag,
                 ": BERT trains on one `_text_sentence` dataset per split; blends of several "
                 "prefixes are not supported for BERT yet (merge the JSON-lines inputs and "
                 "preprocess once)");
  return tokens.back();
}

}  // namespace

Datasets bert_datasets(const DataConfig& a, const Tokenizer& tokenizer, int64_t seq_length,
                       const SampleCounts& n, bool log) {
  MEGATRON_CHECK(!a.mock_data,
                 "--mock-data makes GPT documents; BERT needs sentences: pass "
                 "--data-path with a `megatron preprocess --split-sentences` dataset");
  BertDatasetConfig config;
  config.random_seed = a.seed;
  config.sequence_length = seq_length;
  config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  config.path_to_cache = a.data_cache_path;
  config.short_sequence_probability = a.short_seq_prob;
  config.masking.masking_probability = a.mask_prob;
  config.classification_head = a.bert_binary_head;
  config.log = log;
  const std::array<int64_t, 3> counts = {n.train, n.valid, n.test};
  std::array<std::unique_ptr<SampleSource>, 3> out;
  if (log) log_line("> building train, validation, and test datasets for BERT ...");
  const std::string prefix = single_prefix(a.data_path, "--data-path");
  if (!prefix.empty()) {
    MEGATRON_CHECK(
        a.train_data_path.empty() && a.valid_data_path.empty() && a.test_data_path.empty(),
        "--data-path and --train/valid/test-data-path are exclusive; pass one or the "
        "other");
    config.split = a.split;
    auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
    const auto ranges = split_document_ranges(a.split, data->num_documents());
    for (size_t i = 0; i < 3; ++i) {
      if (!ranges[i] || ranges[i]->size() == 0 || counts[i] <= 0) continue;
      out[i] = std::make_unique<BertDataset>(data, *ranges[i], counts[i], static_cast<Split>(i),
                                             config, tokenizer);
    }
  } else {
    const std::array<const std::vector<std::string>*, 3> paths = {
        &a.train_data_path, &a.valid_data_path, &a.test_data_path};
    const std::array<const char*, 3> flags = {"--train-data-path", "--valid-data-path",
                                              "--test-data-path"};
    for (size_t i = 0; i < 3; ++i) {
      const std::string p = single_prefix(*paths[i], flags[i]);
      if (p.empty() || counts[i] <= 0) continue;
      auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(p));
      out[i] = std::make_unique<BertDataset>(data, DocumentRange{0, data->num_documents()},
                                             counts[i], static_cast<Split>(i), config, tokenizer);
    }
  }
  MEGATRON_CHECK(out[0] != nullptr,
                 "no training data for BERT: pass --data-path (a "
                 "`_text_sentence` dataset) with a non-zero training share in --split, or "
                 "--train-data-path");
  if (log) {
    const char* names[] = {"train", "validation", "test"};
    for (size_t i = 0; i < 3; ++i)
      log_line(std::string(" > ") + names[i] + ": " +
               (out[i] ? std::to_string(out[i]->size()) + " samples" : std::string("none")));
  }
  Datasets d;
  d.train = std::move(out[0]);
  d.valid = std::move(out[1]);
  d.test = std::move(out[2]);
  return d;
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
