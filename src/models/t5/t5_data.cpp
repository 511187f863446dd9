// T5 datasets per split and T5 micro-batches.
#include "models/t5/t5_data.h"

#include <array>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/gpt_batch.h"
#include "data/indexed_dataset.h"
#include "data/t5_dataset.h"
#include "models/t5/t5_chunk.h"

namespace megatron {

namespace {

// The one prefix of a --data-path style list ("prefix" or "weight prefix").
std::string single_prefix(const std::vector<std::string>& args, const char* flag) {
  std::vector<std::string> tokens;
  for (const std::string& a : args) {
    std::istringstream in(a);
    for (std::string t; in >> t;) tokens.push_back(t);
  }
  if (tokens.empty()) return "";
  MEGATRON_CHECK(tokens.size() == 1 || tokens.size() == 2, flag,
                 ": T5 trains on one `_text_sentence` dataset per split; blends of several "
                 "prefixes are not supported for T5 yet (merge the JSON-lines inputs and "
                 "preprocess once)");
  return tokens.back();
}

}  // namespace

Datasets t5_datasets(const DataConfig& a, const Tokenizer& tokenizer, int64_t seq_length,
                     const SampleCounts& n, bool log) {
  MEGATRON_CHECK(!a.mock_data,
                 "--mock-data makes GPT documents; T5 needs sentences: pass --data-path with a "
                 "`megatron preprocess --split-sentences` dataset");
  T5DatasetConfig config;
  config.random_seed = a.seed;
  config.sequence_length = seq_length;
  config.sequence_length_decoder = a.decoder_seq_length;
  config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  config.path_to_cache = a.data_cache_path;
  config.short_sequence_probability = a.short_seq_prob;
  config.masking.masking_probability = a.mask_prob;
  config.log = log;
  const std::array<int64_t, 3> counts = {n.train, n.valid, n.test};
  std::array<std::unique_ptr<SampleSource>, 3> out;
  if (log) log_line("> building train, validation, and test datasets for T5 ...");
  const std::string prefix = single_prefix(a.data_path, "--data-path");
  if (!prefix.empty()) {
    MEGATRON_CHECK(
        a.train_data_path.empty() && a.valid_data_path.empty() && a.test_data_path.empty(),
        "--data-path and --train/valid/test-data-path are exclusive; pass one or the other");
    config.split = a.split;
    auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
    const auto ranges = split_document_ranges(a.split, data->num_documents());
    for (size_t i = 0; i < 3; ++i) {
      if (!ranges[i] || ranges[i]->size() == 0 || counts[i] <= 0) continue;
      out[i] = std::make_unique<T5Dataset>(data, *ranges[i], counts[i], static_cast<Split>(i),
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
      out[i] = std::make_unique<T5Dataset>(data, DocumentRange{0, data->num_documents()}, counts[i],
                                           static_cast<Split>(i), config, tokenizer);
    }
  }
  MEGATRON_CHECK(out[0] != nullptr,
                 "no training data for T5: pass --data-path (a `_text_sentence` dataset) with a "
                 "non-zero training share in --split, or --train-data-path");
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

BatchFn t5_batch_maker(const DataConfig& config, const Tokenizer& tokenizer) {
  (void)tokenizer;  // T5Dataset checks the special tokens and sentinels when it is built
  const int64_t s_dec = config.decoder_seq_length;
  MEGATRON_CHECK(s_dec > 0, "T5 needs --decoder-seq-length");
  return [s_dec](const SampleSource& data, int64_t first, int64_t b) {
    const int64_t s_enc = data.seq_length(), width = data.sample_width();
    MEGATRON_CHECK(width == T5Record::width(s_enc, s_dec), "T5 batches need T5 samples");
    Tensor enc = Tensor::empty({b, s_enc}, DType::kI64),
           dec = Tensor::empty({b, s_dec}, DType::kI64);
    Tensor labels = Tensor::empty({b, s_dec}, DType::kI64);
    Tensor loss_mask = Tensor::empty({b, s_dec}, DType::kF32);
    Tensor enc_mask = Tensor::empty({b, s_enc}, DType::kI32);
    Tensor dec_mask = Tensor::empty({b, s_dec}, DType::kI32);
    std::vector<int64_t> record(static_cast<size_t>(width));
    for (int64_t i = 0; i < b; ++i) {
      data.sample(first + i, record.data());
      const T5Record r(record.data(), s_enc, s_dec);
      for (int64_t t = 0; t < s_enc; ++t) {
        enc.data<int64_t>()[i * s_enc + t] = r.text_enc[t];
        enc_mask.data<int32_t>()[i * s_enc + t] = r.enc_mask[t] != 0 ? 1 : 0;
      }
      for (int64_t t = 0; t < s_dec; ++t) {
        dec.data<int64_t>()[i * s_dec + t] = r.text_dec[t];
        labels.data<int64_t>()[i * s_dec + t] = r.labels[t];
        loss_mask.data<float>()[i * s_dec + t] = static_cast<float>(r.loss_mask[t]);
        dec_mask.data<int32_t>()[i * s_dec + t] = r.dec_mask[t] != 0 ? 1 : 0;
      }
    }
    return TensorMap{{kT5TextEnc, enc},      {kT5TextDec, dec},      {kLabels, labels},
                     {kLossMask, loss_mask}, {kT5EncMask, enc_mask}, {kT5DecMask, dec_mask}};
  };
}

}  // namespace megatron
