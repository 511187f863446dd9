// BertDataset: Megatron's BERTMaskedWordPieceDataset (megatron/core/datasets/bert_dataset.py,
// core r0.14) over a `_text_sentence` IndexedDataset (`megatron preprocess --split-sentences`):
// sample i here is sample i there.
//
// The split's documents are read as runs of sentences. The sample mapping (data/masked_lm.h,
// max length seq_length - 3 for [CLS] and two [SEP], at least two sentences per sample with the
// binary head) is cached as Megatron does, `<cache>/<md5>-BERTMaskedWordPieceDataset-
// sample_index.npy` plus the description. Sample i, with RandomState((seed + i) % 2^32):
// - with the binary head: pivot 1, or randint(1, n) for n >= 3 sentences; is_random =
//   random() < 0.5; A = sentences before the pivot, B = the rest, swapped when is_random (the
//   label is sentence order, Megatron's "SOP");
// - while |A| + |B| exceeds the target length: the longer segment (B on ties) loses its first
//   token when random() < 0.5, else its last;
// - tokens [CLS] A [SEP] (B [SEP]), types 0 for [CLS] A [SEP] and 1 for B [SEP];
// - masking (data/masked_lm.h) with BERT's rule: [MASK] when random() < 0.8, else when
//   random() >= 0.5 a uniformly random id of the whole vocabulary (special tokens included);
// - padded to seq_length with the [PAD] id (in text, types and padding_mask: Megatron pads all
//   three with the pad id), labels -1 except at masked positions, loss_mask 1 there.
//
// As a SampleSource a sample is one record of sample_width() = 5 s + 2 int64: text, types,
// labels, padding_mask, loss_mask (s each), then is_random and truncated (BertRecord reads it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"  // Split, DocumentRange
#include "data/index_cache.h"
#include "data/masked_lm.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"

namespace megatron {

class IndexedDataset;

// Megatron's BERTMaskedWordPieceDatasetConfig, the fields that shape samples.
struct BertDatasetConfig {
  int64_t random_seed = 1234;               // --seed
  int64_t sequence_length = 0;              // --seq-length
  std::optional<std::string> split;         // --split as given; nullopt with per-split paths
  std::string tokenizer_json = "null";      // the tokenizer's identifiers, for the description
  std::string path_to_cache;                // --data-cache-path ("" = <prefix>/cache/...)
  double short_sequence_probability = 0.1;  // --short-seq-prob
  MaskingConfig masking;                    // --mask-prob and pretrain_bert's fixed choices
  bool classification_head = true;          // false with --bert-no-binary-head
  bool log = true;
};

// The fields of one sample, views into a record of BertDataset::sample_width() int64.
struct BertRecord {
  static int64_t width(int64_t s) { return 5 * s + 2; }
  BertRecord(const int64_t* record, int64_t s)
      : text(record, s),
        types(record + s, s),
        labels(record + 2 * s, s),
        padding_mask(record + 3 * s, s),
        loss_mask(record + 4 * s, s),
        is_random(record[5 * s]),
        truncated(record[5 * s + 1]) {}
  std::span<const int64_t> text, types, labels, padding_mask, loss_mask;
  int64_t is_random, truncated;
};

// The special ids and word-continuation table of a WordPiece tokenizer; refuses (naming
// --tokenizer-type and --vocab-file) one without [CLS], [SEP], [PAD] and [MASK].
MaskingVocab masking_vocab(const Tokenizer& tokenizer);

// Megatron's unique description (JSON, 4-space indent) of a BERT dataset; its MD5 names the cache.
std::string bert_dataset_description(const std::string& dataset_path,
                                     std::optional<int64_t> num_samples, Split split,
                                     const BertDatasetConfig& config);

class BertDataset : public SampleSource {
 public:
  // documents: this split's documents; num_samples nullopt = one epoch. Refuses (naming the
  // dataset) a `_text_document` dataset, whose documents are single sentences.
  BertDataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
              std::optional<int64_t> num_samples, Split split, const BertDatasetConfig& config,
              const Tokenizer& tokenizer);

  int64_t size() const override { return sample_index_.shape()[0]; }
  int64_t seq_length() const override { return config_.sequence_length; }
  int64_t sample_width() const override { return BertRecord::width(config_.sequence_length); }
  void sample(int64_t index, int64_t* out) const override;

  const NpyArray& sample_index() const { return sample_index_; }
  const std::string& description() const { return description_; }
  Split split() const { return split_; }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  Split split_;
  BertDatasetConfig config_;
  MaskingVocab vocab_;
  SpecialTokens special_;
  int64_t vocab_size_ = 0;
  std::string description_;
  NpyArray sample_index_;
};

}  // namespace megatron
