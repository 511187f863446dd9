// T5Dataset: Megatron's T5MaskedWordPieceDataset (megatron/core/datasets/t5_dataset.py, core
// r0.14), span corruption over a `_text_sentence` IndexedDataset: sample i here is sample i there.
// It is BertDataset's sibling (data/bert_dataset.h) and shares its masked-LM machinery
// (data/masked_lm.h); it is not the original T5 recipe (no mean span length 3, no noise density:
// Megatron draws SpanBERT's geometric span lengths under BERT's masking budget).
//
// Sample index: build_mapping with max length sequence_length - 2 (room for [BOS] and [EOS] as
// Megatron reasons; neither goes into the encoder) and one sentence per sample at least, cached
// as `<cache>/<md5>-T5MaskedWordPieceDataset-sample_index.npy` plus the description. Sample i,
// with RandomState((seed + i) % 2^32):
// - the sentences are concatenated and cut to the row's target length (truncated = it was cut);
// - masking (data/masked_lm.h) with pretrain_t5.py's choices: whole words, n = min(Geometric(0.2),
//   10) words per span, budget min(p * target, max(1, round(p * tokens))); every selected token
//   becomes [MASK] without a draw (the spans are removed anyway);
// - the spans, by first position, take the sentinels <extra_id_0>, <extra_id_1>, .. in order (one
//   per selected n-gram, so two adjacent n-grams take two sentinels):
//     encoder input  = the tokens outside the spans, each span replaced by its sentinel (as
//                      Megatron slices: a [CLS]/[SEP] id inside a span is dropped with it);
//     decoder input  = [BOS], then per span: sentinel, original tokens;
//     labels         = per span: sentinel, original tokens; then [EOS] (decoder input shifted);
// - text_enc is padded to sequence_length and text_dec to sequence_length_decoder with the [PAD]
//   id, labels with -1; loss_mask is 1 over the decoder input's length; enc_mask and dec_mask are
//   1 at real positions and 0 at padding (1/0, unlike BERT's padding_mask, which Megatron pads
//   with the pad id).
//
// Masks: Megatron's dataset returns enc_mask and dec_mask as these 1-D [s] flags too;
// pretrain_t5.get_batch turns them into attention masks (config_attention_mask): encoder
// NOT(pad_q AND pad_k), decoder the same AND causal, cross-attention decoder pad_q AND encoder
// pad_k. So the record stores the flags and the model builds the [b, 1, q, k] masks. (Megatron's
// local-spec path derives those masks from token ids >= 1 instead of the flags; with [PAD] = 0,
// the usual vocab, both agree.)
//
// As a SampleSource a sample is one record of sample_width() = 2 s_enc + 4 s_dec + 1 int64 (see
// T5Record). seq_length() is the encoder length.
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

// Megatron's T5MaskedWordPieceDatasetConfig as pretrain_t5.py fills it.
struct T5DatasetConfig {
  int64_t random_seed = 1234;               // --seed
  int64_t sequence_length = 0;              // --encoder-seq-length (encoder tokens)
  int64_t sequence_length_decoder = 0;      // --decoder-seq-length (decoder tokens)
  std::optional<std::string> split;         // --split as given; nullopt with per-split paths
  std::string tokenizer_json = "null";      // the tokenizer's identifiers, for the description
  std::string path_to_cache;                // --data-cache-path ("" = <prefix>/cache/...)
  double short_sequence_probability = 0.1;  // --short-seq-prob
  // --mask-prob and pretrain_t5.py's fixed choices: max 10 words per span, whole words,
  // geometric span lengths, no longer-n-gram bias (and no permutation, which MaskingConfig lacks).
  MaskingConfig masking{.masking_probability = 0.15,
                        .masking_max_ngram = 10,
                        .masking_do_full_word = true,
                        .masking_use_longer_ngrams = false,
                        .masking_use_geometric_distribution = true};
  bool log = true;  // print Megatron's build/load lines
};

// The fields of one sample, views into a record of T5Record::width(s_enc, s_dec) int64, in
// Megatron's key order.
struct T5Record {
  static int64_t width(int64_t s_enc, int64_t s_dec) { return 2 * s_enc + 4 * s_dec + 1; }
  T5Record(const int64_t* record, int64_t s_enc, int64_t s_dec)
      : text_enc(record, s_enc),
        text_dec(record + s_enc, s_dec),
        labels(record + s_enc + s_dec, s_dec),
        loss_mask(record + s_enc + 2 * s_dec, s_dec),
        enc_mask(record + s_enc + 3 * s_dec, s_enc),
        dec_mask(record + 2 * s_enc + 3 * s_dec, s_dec),
        truncated(record[2 * s_enc + 4 * s_dec]) {}
  std::span<const int64_t> text_enc;   // [s_enc] encoder input ids, [PAD]-padded
  std::span<const int64_t> text_dec;   // [s_dec] decoder input ids, [PAD]-padded
  std::span<const int64_t> labels;     // [s_dec] decoder targets, -1 at padding
  std::span<const int64_t> loss_mask;  // [s_dec] 1 over the decoder input, else 0
  std::span<const int64_t> enc_mask;   // [s_enc] 1 real, 0 padding
  std::span<const int64_t> dec_mask;   // [s_dec] 1 real, 0 padding
  int64_t truncated;                   // 1 when the sentences were cut to the target length
};

// Megatron's unique description (JSON, 4-space indent) of a T5 dataset; its MD5 names the cache.
std::string t5_dataset_description(const std::string& dataset_path,
                                   std::optional<int64_t> num_samples, Split split,
                                   const T5DatasetConfig& config);

class T5Dataset : public SampleSource {
 public:
  // documents: this split's documents; num_samples nullopt = one epoch. Refuses a tokenizer
  // without [CLS], [SEP], [PAD], [MASK], [BOS], [EOS] or sentinels (naming --vocab-extra-ids), a
  // `_text_document` dataset (naming --split-sentences) and lengths too short to hold a sample.
  T5Dataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
            std::optional<int64_t> num_samples, Split split, const T5DatasetConfig& config,
            const Tokenizer& tokenizer);

  int64_t size() const override { return sample_index_.shape()[0]; }
  int64_t seq_length() const override { return config_.sequence_length; }
  int64_t sample_width() const override {
    return T5Record::width(config_.sequence_length, config_.sequence_length_decoder);
  }
  // Throws InvalidArgument (where Megatron fails an assert or runs out of sentinels) when the
  // sample needs more sentinels than --vocab-extra-ids gives or a longer --decoder-seq-length.
  void sample(int64_t index, int64_t* out) const override;

  const NpyArray& sample_index() const { return sample_index_; }
  const std::string& description() const { return description_; }
  Split split() const { return split_; }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  Split split_;
  T5DatasetConfig config_;
  MaskingVocab vocab_;
  SpecialTokens special_;
  std::string description_;
  NpyArray sample_index_;
};

}  // namespace megatron
