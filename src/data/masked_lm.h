// Masked-LM sample construction shared by Megatron's WordPiece datasets (BERT, T5's span
// corruption): the sentence-level sample mapping of helpers.cpp's build_mapping and
// MaskedWordPieceDataset._create_masked_lm_predictions, draw for draw, so that sample i here is
// sample i in Megatron (megatron/core/datasets/masked_dataset.py and helpers.cpp, core r0.14).
//
// Sample mapping: rows (first sentence, end sentence, target length) over the sentences of a
// split's documents. Two identical passes (count, then fill) each re-seed std::mt19937(seed);
// per document with at least min_num_sent sentences and, when it has more than one, none longer
// than 512 tokens: draw a target length (max_seq_length, or with probability about
// short_seq_prob, 2 + r % (max_seq_length - 1)), accumulate sentences and close a sample when the
// length reaches the target with more than one sentence left and enough sentences taken, or at
// the document's end; draw a new target after every sample. Epochs repeat until max_num_samples
// rows exist (checked before each epoch, so whole epochs). Then a Fisher-Yates shuffle with
// std::mt19937_64(seed + 1): j = rng() % (i + 1) for i = n-1 .. 1.
//
// Masking: candidates are whole words (a "##" piece joins the word before it) except [CLS] and
// [SEP]; the budget is min(p * target, max(1, round(p * tokens))); the candidates' n-gram lists
// are shuffled, and each start in turn draws n (P(n) ~ 1/n, or longer-first, or SpanBERT's
// geometric), shrinks n until the n-gram fits the budget, skips overlaps, and replaces each token
// through the dataset's token-mask rule (BERT: [MASK] 80%, random id 10%, unchanged 10%). The
// candidate list is shuffled once more afterwards (Megatron does, so the stream advances).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/gpt_dataset.h"  // Split, GPTDatasetConfig
#include "data/index_cache.h"
#include "data/numpy_random.h"

namespace megatron {

// Megatron's LONG_SENTENCE_LEN: a document with a sentence longer than this (and more than one
// sentence) gives no samples.
constexpr int32_t kLongSentenceLength = 512;

// helpers.cpp build_mapping. sentence_bounds: the split's documents' sentence boundaries
// (document d holds sentences [bounds[d], bounds[d + 1])); sentence_lengths: tokens per sentence
// (all sentences of the indexed dataset). Returns [n, 3] uint32.
NpyArray build_sample_mapping(std::span<const int64_t> sentence_bounds,
                              std::span<const int32_t> sentence_lengths, int32_t num_epochs,
                              uint64_t max_num_samples, int32_t max_seq_length,
                              double short_seq_prob, int32_t seed, int32_t min_num_sent);

// Empty when `mapping` (build_sample_mapping's [n, 3] uint32) fits the split's sentences
// [bounds.front(), bounds.back()) with targets in [2, max_seq_length], else why; a cached mapping
// failing this is rebuilt.
std::string check_sample_mapping(const NpyArray& mapping, std::span<const int64_t> sentence_bounds,
                                 int64_t max_seq_length);

struct MaskingConfig {
  double masking_probability = 0.15;                // --mask-prob
  int64_t masking_max_ngram = 3;                    // pretrain_bert: 3
  bool masking_do_full_word = true;                 // pretrain_bert: True
  bool masking_use_longer_ngrams = false;           // pretrain_bert: False
  bool masking_use_geometric_distribution = false;  // pretrain_bert: False (T5: True)
};

// Megatron's description of a MaskedWordPieceDataset (BERT's, T5's): the MegatronDataset
// identifiers of `base` under class `cls`, then the masked-LM key attributes, in Megatron's
// order; the dataset appends its own keys and dumps it with 4-space indent.
nlohmann::ordered_json masked_dataset_description(const char* cls, const std::string& dataset_path,
                                                  std::optional<int64_t> num_samples, Split split,
                                                  const GPTDatasetConfig& base,
                                                  double short_sequence_probability,
                                                  const MaskingConfig& masking);

// What masking needs of the tokenizer: the ids it skips and which pieces continue a word.
struct MaskingVocab {
  int64_t cls = -1, sep = -1;
  std::vector<uint8_t> continuation;  // per id: the piece starts with "##"
};

struct MaskedSpan {
  std::vector<int64_t> positions, labels;
};

struct MaskedLmResult {
  std::vector<int64_t> tokens;             // the input with the replacements
  std::vector<int64_t> positions, labels;  // every selected position (ascending), original id
  std::vector<MaskedSpan> spans;           // selected n-grams, by first position
};

// A dataset's replacement for one selected token: an id, or nullopt to keep the original.
using TokenMaskFn = std::function<std::optional<int64_t>(NumpyRandomState&)>;

MaskedLmResult create_masked_lm_predictions(std::span<const int64_t> tokens,
                                            int64_t target_sequence_length,
                                            const MaskingConfig& config, const MaskingVocab& vocab,
                                            NumpyRandomState& rng, const TokenMaskFn& token_mask);

}  // namespace megatron
