// T5Dataset: see the header.
#include "data/t5_dataset.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/bert_dataset.h"  // masking_vocab
#include "data/indexed_dataset.h"

namespace megatron {

namespace {

constexpr const char* kClass = "T5MaskedWordPieceDataset";
constexpr std::string_view kSuffixes[] = {"sample_index.npy"};

// Appends tokens[begin, end) with Python's slice semantics (an empty run when end <= begin).
void append_slice(std::span<const int64_t> tokens, int64_t begin, int64_t end,
                  std::vector<int64_t>& out) {
  const auto n = static_cast<int64_t>(tokens.size());
  begin = std::clamp<int64_t>(begin, 0, n);
  end = std::clamp<int64_t>(end, 0, n);
  if (end > begin) out.insert(out.end(), tokens.begin() + begin, tokens.begin() + end);
}

}  // namespace

std::string t5_dataset_description(const std::string& dataset_path,
                                   std::optional<int64_t> num_samples, Split split,
                                   const T5DatasetConfig& config) {
  // Megatron's MegatronDataset identifiers, the masked-LM key attributes, then T5's one.
  GPTDatasetConfig base;
  base.random_seed = config.random_seed;
  base.sequence_length = config.sequence_length;
  base.split = config.split;
  base.tokenizer_json = config.tokenizer_json;
  auto j = masked_dataset_description(kClass, dataset_path, num_samples, split, base,
                                      config.short_sequence_probability, config.masking);
  j["sequence_length_decoder"] = config.sequence_length_decoder;
  return j.dump(4, ' ', true);
}

T5Dataset::T5Dataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
                     std::optional<int64_t> num_samples, Split split, const T5DatasetConfig& config,
                     const Tokenizer& tokenizer)
    : dataset_(std::move(dataset)), split_(split), config_(config) {
  const std::string& prefix = dataset_->prefix();
  // build_mapping needs a maximum length of 2 or more (it draws short targets in [2, max]).
  MEGATRON_CHECK(config.sequence_length >= 4, "--encoder-seq-length ", config.sequence_length,
                 " is too short for T5: samples need at least two tokens plus room for [BOS] and "
                 "[EOS] (sample length = encoder length - 2); use 4 or more");
  MEGATRON_CHECK(config.sequence_length_decoder >= 1, "--decoder-seq-length ",
                 config.sequence_length_decoder,
                 " is too short for T5: the decoder input holds [BOS] at least");
  MEGATRON_CHECK(config.masking.masking_probability > 0 && config.masking.masking_probability < 1,
                 "--mask-prob ", config.masking.masking_probability, " must be in (0, 1)");
  MEGATRON_CHECK(config.masking.masking_max_ngram > 0, "masking_max_ngram ",
                 config.masking.masking_max_ngram, " must be positive");
  MEGATRON_CHECK(config.short_sequence_probability >= 0 && config.short_sequence_probability <= 1,
                 "--short-seq-prob ", config.short_sequence_probability, " must be in [0, 1]");
  MEGATRON_CHECK(
      config.random_seed >= 0 && config.random_seed <= std::numeric_limits<int32_t>::max(),
      "--seed ", config.random_seed, " must be in [0, 2^31) for T5's sample mapping");
  MEGATRON_CHECK(
      documents.begin >= 0 && documents.end <= dataset_->num_documents() && documents.size() > 0,
      "T5 dataset ", prefix, ": no documents in the ", split_name(split), " split");
  // A `_text_document` dataset (no --split-sentences) has one sequence per document. Megatron
  // takes it (its T5 example passes one): each document is one "sentence" of the sample mapping,
  // which skips documents longer than its 512-token sentence limit. Said, not refused.
  const auto doc_index = dataset_->document_indices();
  if (dataset_->num_sequences() <= dataset_->num_documents() && config.log) {
    log_line("> warning: " + prefix +
             " has one sequence per document (preprocessed without --split-sentences): each "
             "document is one sentence of T5's sample mapping, which skips documents of more "
             "than 512 tokens; `megatron preprocess --split-sentences` gives T5 all of them");
  }
  special_ = tokenizer.special_tokens();
  MEGATRON_CHECK(special_.cls >= 0 && special_.sep >= 0 && special_.pad >= 0 &&
                     special_.mask >= 0 && special_.bos >= 0 && special_.eos >= 0,
                 "T5 data needs a WordPiece tokenizer with [CLS], [SEP], [PAD], [MASK], [BOS] and "
                 "[EOS]; pass --tokenizer-type BertWordPieceLowerCase (or BertWordPieceCase) and "
                 "its --vocab-file (tokenizer: ",
                 tokenizer.identity(), ")");
  MEGATRON_CHECK(!special_.additional.empty(),
                 "T5 data needs sentinel tokens and the tokenizer has none; pass "
                 "--vocab-extra-ids N (100 in Megatron's T5 examples) to add <extra_id_0> .. "
                 "<extra_id_{N-1}> (tokenizer: ",
                 tokenizer.identity(), ")");
  vocab_ = masking_vocab(tokenizer);

  const std::span<const int64_t> bounds = doc_index.subspan(
      static_cast<size_t>(documents.begin), static_cast<size_t>(documents.size() + 1));
  description_ = t5_dataset_description(prefix, num_samples, split, config);
  const std::string cache_dir =
      config.path_to_cache.empty()
          ? (std::filesystem::path(prefix) / "cache" / (std::string(kClass) + "_indices")).string()
          : config.path_to_cache;
  const IndexCache cache(cache_dir, kClass, "", description_);
  const std::string name = split_name(split);
  const int64_t max_length = config.sequence_length - 2;
  std::string why;
  if (auto arrays = cache.load(kSuffixes, &why)) {
    why = check_sample_mapping((*arrays)[0], bounds, max_length);
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
        bounds, dataset_->sequence_lengths(), epochs, max_samples, static_cast<int32_t>(max_length),
        config.short_sequence_probability, static_cast<int32_t>(config.random_seed), 1);
    const NpyArray* arrays[] = {&sample_index_};
    cache.save(kSuffixes, arrays);
    if (config.log) log_line("> total number of samples: " + std::to_string(size()));
  }
  MEGATRON_CHECK(size() > 0, "--data-path ", prefix, ": the ", name,
                 " split gives no T5 samples (documents need a sentence and no sentence over "
                 "512 tokens when they have several); use more data or --split");
}

void T5Dataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample ", index,
                 " is outside the T5 dataset's [0, ", size(), ")");
  const int64_t s_enc = config_.sequence_length, s_dec = config_.sequence_length_decoder;
  const int64_t first = sample_index_.get(3 * index), end = sample_index_.get(3 * index + 1);
  const int64_t target = sample_index_.get(3 * index + 2);
  NumpyRandomState rng(static_cast<uint32_t>(
      (static_cast<uint64_t>(config_.random_seed) + static_cast<uint64_t>(index)) % (1ULL << 32)));

  std::vector<int64_t> tokens;
  for (int64_t i = first; i < end; ++i) {
    const int64_t len = dataset_->sequence_lengths()[static_cast<size_t>(i)];
    const size_t at = tokens.size();
    tokens.resize(at + static_cast<size_t>(len));
    dataset_->read(i, 0, len, tokens.data() + at);
  }
  const bool truncated = static_cast<int64_t>(tokens.size()) > target;
  if (truncated) tokens.resize(static_cast<size_t>(target));

  const int64_t mask_id = special_.mask;
  const MaskedLmResult m = create_masked_lm_predictions(
      tokens, target, config_.masking, vocab_, rng,
      [mask_id](NumpyRandomState&) -> std::optional<int64_t> { return mask_id; });

  const auto& sentinels = special_.additional;
  MEGATRON_CHECK(m.spans.size() <= sentinels.size(), "T5 sample ", index, " masks ", m.spans.size(),
                 " spans but the tokenizer has ", sentinels.size(),
                 " sentinels; pass a larger --vocab-extra-ids (Megatron's examples use 100)");
  std::vector<int64_t> encoder, decoder{special_.bos}, labels;
  int64_t begin = 0;
  for (size_t k = 0; k < m.spans.size(); ++k) {
    const MaskedSpan& span = m.spans[k];
    const int64_t sentinel = sentinels[k];
    append_slice(m.tokens, begin, span.positions.front(), encoder);
    encoder.push_back(sentinel);
    decoder.push_back(sentinel);
    decoder.insert(decoder.end(), span.labels.begin(), span.labels.end());
    labels.push_back(sentinel);
    labels.insert(labels.end(), span.labels.begin(), span.labels.end());
    begin = span.positions.back() + 1;
  }
  append_slice(m.tokens, begin, static_cast<int64_t>(m.tokens.size()), encoder);
  labels.push_back(special_.eos);

  const auto n_enc = static_cast<int64_t>(encoder.size());
  const auto n_dec = static_cast<int64_t>(decoder.size());
  MEGATRON_CHECK(n_enc <= s_enc, "T5 sample ", index, " has ", n_enc,
                 " encoder tokens for --encoder-seq-length ", s_enc,
                 "; the sample index is corrupt");
  MEGATRON_CHECK(n_dec <= s_dec, "T5 sample ", index, " has ", n_dec,
                 " decoder tokens ([BOS], sentinels and masked tokens) for --decoder-seq-length ",
                 s_dec,
                 "; raise --decoder-seq-length (1 + 2 x --mask-prob x (--encoder-seq-length - 2) "
                 "always suffices) or lower --mask-prob");
  int64_t* text_enc = out;
  int64_t* text_dec = out + s_enc;
  int64_t* label_out = out + s_enc + s_dec;
  int64_t* loss_mask = out + s_enc + 2 * s_dec;
  int64_t* enc_mask = out + s_enc + 3 * s_dec;
  int64_t* dec_mask = out + 2 * s_enc + 3 * s_dec;
  for (int64_t i = 0; i < s_enc; ++i) {
    const bool real = i < n_enc;
    text_enc[i] = real ? encoder[static_cast<size_t>(i)] : special_.pad;
    enc_mask[i] = real ? 1 : 0;
  }
  for (int64_t i = 0; i < s_dec; ++i) {
    const bool real = i < n_dec;
    text_dec[i] = real ? decoder[static_cast<size_t>(i)] : special_.pad;
    label_out[i] = real ? labels[static_cast<size_t>(i)] : -1;
    loss_mask[i] = real ? 1 : 0;
    dec_mask[i] = real ? 1 : 0;
  }
  out[2 * s_enc + 4 * s_dec] = truncated ? 1 : 0;
}

}  // namespace megatron
