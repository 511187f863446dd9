// BertDataset: see the header.
#include "data/bert_dataset.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/indexed_dataset.h"

namespace megatron {

namespace {

constexpr const char* kClass = "BERTMaskedWordPieceDataset";
constexpr std::string_view kSuffixes[] = {"sample_index.npy"};

}  // namespace

MaskingVocab masking_vocab(const Tokenizer& tokenizer) {
  const SpecialTokens sp = tokenizer.special_tokens();
  MEGATRON_CHECK(sp.cls >= 0 && sp.sep >= 0 && sp.pad >= 0 && sp.mask >= 0,
                 "BERT data needs a WordPiece tokenizer with [CLS], [SEP], [PAD] and [MASK]; "
                 "pass --tokenizer-type BertWordPieceLowerCase (or BertWordPieceCase) and its "
                 "--vocab-file (tokenizer: ",
                 tokenizer.identity(), ")");
  MaskingVocab v;
  v.cls = sp.cls;
  v.sep = sp.sep;
  v.continuation.resize(static_cast<size_t>(tokenizer.vocab_size()));
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id)
    v.continuation[static_cast<size_t>(id)] = tokenizer.piece(id).rfind("##", 0) == 0;
  return v;
}

std::string bert_dataset_description(const std::string& dataset_path,
                                     std::optional<int64_t> num_samples, Split split,
                                     const BertDatasetConfig& config) {
  // Megatron's MegatronDataset identifiers, then the masked-LM and BERT key attributes.
  GPTDatasetConfig base;
  base.random_seed = config.random_seed;
  base.sequence_length = config.sequence_length;
  base.split = config.split;
  base.tokenizer_json = config.tokenizer_json;
  auto j = masked_dataset_description(kClass, dataset_path, num_samples, split, base,
                                      config.short_sequence_probability, config.masking);
  j["classification_head"] = config.classification_head;
  return j.dump(4, ' ', true);
}

BertDataset::BertDataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
                         std::optional<int64_t> num_samples, Split split,
                         const BertDatasetConfig& config, const Tokenizer& tokenizer)
    : dataset_(std::move(dataset)), split_(split), config_(config) {
  const std::string& prefix = dataset_->prefix();
  MEGATRON_CHECK(config.sequence_length >= 5, "--seq-length ", config.sequence_length,
                 " is too short for BERT: samples need [CLS], two [SEP] and two tokens");
  MEGATRON_CHECK(config.masking.masking_probability > 0 && config.masking.masking_probability < 1,
                 "--mask-prob ", config.masking.masking_probability, " must be in (0, 1)");
  MEGATRON_CHECK(config.short_sequence_probability >= 0 && config.short_sequence_probability <= 1,
                 "--short-seq-prob ", config.short_sequence_probability, " must be in [0, 1]");
  MEGATRON_CHECK(
      config.random_seed >= 0 && config.random_seed <= std::numeric_limits<int32_t>::max(),
      "--seed ", config.random_seed, " must be in [0, 2^31) for BERT's sample mapping");
  MEGATRON_CHECK(
      documents.begin >= 0 && documents.end <= dataset_->num_documents() && documents.size() > 0,
      "BERT dataset ", prefix, ": no documents in the ", split_name(split), " split");
  // Each document of a `_text_sentence` dataset is several sentences; a `_text_document` one
  // (preprocessed without --split-sentences) has one sequence per document, which gives BERT
  // nothing to pair (Megatron would silently build an empty or one-segment dataset).
  const auto doc_index = dataset_->document_indices();
  MEGATRON_CHECK(dataset_->num_sequences() > dataset_->num_documents(), "--data-path ", prefix,
                 ": every document is a single sequence, so it was preprocessed without "
                 "--split-sentences; BERT reads sentences: run `megatron preprocess "
                 "--split-sentences` (output <prefix>_text_sentence) and pass that");
  vocab_ = masking_vocab(tokenizer);
  special_ = tokenizer.special_tokens();
  vocab_size_ = tokenizer.vocab_size();

  const std::span<const int64_t> bounds = doc_index.subspan(
      static_cast<size_t>(documents.begin), static_cast<size_t>(documents.size() + 1));
  description_ = bert_dataset_description(prefix, num_samples, split, config);
  const std::string cache_dir =
      config.path_to_cache.empty()
          ? (std::filesystem::path(prefix) / "cache" / (std::string(kClass) + "_indices")).string()
          : config.path_to_cache;
  const IndexCache cache(cache_dir, kClass, "", description_);
  const std::string name = split_name(split);
  std::string why;
  if (auto arrays = cache.load(kSuffixes, &why)) {
    why = check_sample_mapping((*arrays)[0], bounds, config.sequence_length - 3);
    if (why.empty()) {
      if (config.log) log_line("Load the " + std::string(kClass) + " " + name + " indices");
      sample_index_ = std::move((*arrays)[0]);
    } else if (config.log) {
      log_line("> rebuilding the cached " + std::string(kClass) + " " + name + " indices: " + why);
    }
  }
  if (sample_index_.shape().empty()) {
    if (config.log) log_line("Build and save the " + std::string(kClass) + " " + name + " indices");
    // A sample count asks for as many whole epochs as reach it; none means one epoch.
    const int32_t epochs = num_samples ? std::numeric_limits<int32_t>::max() - 1 : 1;
    const uint64_t max_samples =
        num_samples ? static_cast<uint64_t>(*num_samples) : std::numeric_limits<uint64_t>::max();
    sample_index_ = build_sample_mapping(
        bounds, dataset_->sequence_lengths(), epochs, max_samples,
        static_cast<int32_t>(config.sequence_length - 3), config.short_sequence_probability,
        static_cast<int32_t>(config.random_seed), config.classification_head ? 2 : 1);
    const NpyArray* arrays[] = {&sample_index_};
    cache.save(kSuffixes, arrays);
    if (config.log) log_line("> total number of samples: " + std::to_string(size()));
  }
  MEGATRON_CHECK(size() > 0, "--data-path ", prefix, ": the ", name,
                 " split gives no BERT samples (documents need ",
                 config.classification_head ? "two sentences" : "one sentence",
                 " and no sentence over 512 tokens); use more data or --split");
}

void BertDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample ", index,
                 " is outside the BERT dataset's [0, ", size(), ")");
  const int64_t s = config_.sequence_length;
  const int64_t first = sample_index_.get(3 * index), end = sample_index_.get(3 * index + 1);
  const int64_t target = sample_index_.get(3 * index + 2);
  NumpyRandomState rng(static_cast<uint32_t>(
      (static_cast<uint64_t>(config_.random_seed) + static_cast<uint64_t>(index)) % (1ULL << 32)));

  const int64_t n = end - first;
  int64_t pivot = n;
  bool is_random = false;
  if (config_.classification_head) {
    MEGATRON_CHECK(n > 1, "BERT sample ", index, " has one sentence; the sample index is corrupt");
    pivot = n >= 3 ? rng.randint(1, n) : 1;
    is_random = rng.random() < 0.5;
  }
  std::vector<int64_t> a, b;
  for (int64_t i = first; i < end; ++i) {
    const int64_t len = dataset_->sequence_lengths()[static_cast<size_t>(i)];
    std::vector<int64_t>& seg = i - first < pivot ? a : b;
    const size_t at = seg.size();
    seg.resize(at + static_cast<size_t>(len));
    dataset_->read(i, 0, len, seg.data() + at);
  }
  if (is_random) std::swap(a, b);
  const bool truncated = static_cast<int64_t>(a.size() + b.size()) > target;
  while (static_cast<int64_t>(a.size() + b.size()) > target) {
    std::vector<int64_t>& seg = a.size() > b.size() ? a : b;
    if (rng.random() < 0.5) {
      seg.erase(seg.begin());
    } else {
      seg.pop_back();
    }
  }
  std::vector<int64_t> tokens, types;
  tokens.push_back(special_.cls);
  tokens.insert(tokens.end(), a.begin(), a.end());
  tokens.push_back(special_.sep);
  types.assign(tokens.size(), 0);
  if (!b.empty()) {
    tokens.insert(tokens.end(), b.begin(), b.end());
    tokens.push_back(special_.sep);
    types.resize(tokens.size(), 1);
  }
  const int64_t size_v = vocab_size_;
  const int64_t mask_id = special_.mask;
  const MaskedLmResult m = create_masked_lm_predictions(
      tokens, target, config_.masking, vocab_, rng,
      [size_v, mask_id](NumpyRandomState& r) -> std::optional<int64_t> {
        if (r.random() < 0.8) return mask_id;
        if (r.random() >= 0.5) return r.randint(0, size_v);
        return std::nullopt;
      });
  const auto len = static_cast<int64_t>(m.tokens.size());
  MEGATRON_CHECK(len <= s, "BERT sample ", index, " has ", len, " tokens for --seq-length ", s,
                 "; the sample index is corrupt");
  int64_t* text = out;
  int64_t* type_out = out + s;
  int64_t* labels = out + 2 * s;
  int64_t* padding = out + 3 * s;
  int64_t* loss = out + 4 * s;
  for (int64_t i = 0; i < s; ++i) {
    const bool real = i < len;
    text[i] = real ? m.tokens[static_cast<size_t>(i)] : special_.pad;
    type_out[i] = real ? types[static_cast<size_t>(i)] : special_.pad;
    padding[i] = real ? 1 : special_.pad;
    labels[i] = -1;
    loss[i] = 0;
  }
  for (size_t k = 0; k < m.positions.size(); ++k) {
    labels[m.positions[k]] = m.labels[k];
    loss[m.positions[k]] = 1;
  }
  out[5 * s] = is_random ? 1 : 0;
  out[5 * s + 1] = truncated ? 1 : 0;
}

}  // namespace megatron
