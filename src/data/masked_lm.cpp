// Masked-LM sample mapping and masking: see the header.
#include "data/masked_lm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "data/blended_dataset.h"  // numpy_sum

namespace megatron {

namespace {

int32_t target_sample_length(int32_t short_seq_ratio, int32_t max_length, std::mt19937& rng) {
  if (short_seq_ratio == 0) return max_length;
  const uint32_t r = static_cast<uint32_t>(rng());
  // helpers.cpp mixes uint32 and int32 operands: the arithmetic is unsigned.
  if (r % static_cast<uint32_t>(short_seq_ratio) == 0)
    return static_cast<int32_t>(2 + r % static_cast<uint32_t>(max_length - 1));
  return max_length;
}

}  // namespace

NpyArray build_sample_mapping(std::span<const int64_t> bounds, std::span<const int32_t> sizes,
                              int32_t num_epochs, uint64_t max_num_samples, int32_t max_seq_length,
                              double short_seq_prob, int32_t seed, int32_t min_num_sent) {
  MEGATRON_CHECK(num_epochs > 0 && max_seq_length > 1 && short_seq_prob >= 0 &&
                     short_seq_prob <= 1 && !bounds.empty(),
                 "sample mapping: bad arguments (epochs ", num_epochs, ", max length ",
                 max_seq_length, ", short-sequence probability ", short_seq_prob, ")");
  MEGATRON_CHECK(sizes.size() <= std::numeric_limits<uint32_t>::max(),
                 "sample mapping: more than 2^32 sentences (Megatron switches to uint64 there, "
                 "which this build does not)");
  const int32_t ratio =
      short_seq_prob > 0 ? static_cast<int32_t>(std::round(1.0 / short_seq_prob)) : 0;
  const size_t num_docs = bounds.size() - 1;
  std::vector<uint32_t> maps;
  int64_t num_samples = -1;
  for (int pass = 0; pass < 2; ++pass) {
    const bool fill = pass == 1;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    uint64_t map_index = 0;
    for (int32_t epoch = 0; epoch < num_epochs; ++epoch) {
      if (map_index >= max_num_samples) break;
      for (size_t doc = 0; doc < num_docs; ++doc) {
        const int64_t first = bounds[doc], last = bounds[doc + 1];
        int64_t remain = last - first;
        bool long_sentence = false;
        if (remain > 1) {
          for (int64_t s = first; s < last && !long_sentence; ++s)
            long_sentence = sizes[static_cast<size_t>(s)] > kLongSentenceLength;
        }
        if (remain < min_num_sent || long_sentence) continue;
        int64_t start = first;
        int32_t seq_len = 0, num_sent = 0;
        int32_t target = target_sample_length(ratio, max_seq_length, rng);
        for (int64_t s = first; s < last; ++s) {
          seq_len += sizes[static_cast<size_t>(s)];
          ++num_sent;
          --remain;
          if ((seq_len >= target && remain > 1 && num_sent >= min_num_sent) || remain == 0) {
            if (fill) {
              maps[3 * map_index] = static_cast<uint32_t>(start);
              maps[3 * map_index + 1] = static_cast<uint32_t>(s + 1);
              maps[3 * map_index + 2] = static_cast<uint32_t>(target);
            }
            ++map_index;
            start = s + 1;
            target = target_sample_length(ratio, max_seq_length, rng);
            seq_len = 0;
            num_sent = 0;
          }
        }
      }
      // No document qualifies: every further epoch would be empty too (helpers.cpp walks on
      // through 2^31 of them).
      if (map_index == 0) break;
    }
    if (!fill) {
      num_samples = static_cast<int64_t>(map_index);
      maps.assign(3 * map_index, 0);
    }
  }
  std::mt19937_64 rng64(static_cast<uint64_t>(static_cast<int64_t>(seed) + 1));
  for (int64_t i = num_samples - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng64() % static_cast<uint64_t>(i + 1));
    for (int k = 0; k < 3; ++k) std::swap(maps[3 * i + k], maps[3 * j + k]);
  }
  NpyArray out(NpyDType::kUInt32, {num_samples, 3});
  std::copy(maps.begin(), maps.end(), out.mutable_values<uint32_t>().begin());
  return out;
}

std::string check_sample_mapping(const NpyArray& m, std::span<const int64_t> bounds,
                                 int64_t max_seq_length) {
  if (m.dtype() != NpyDType::kUInt32 || m.shape().size() != 2 || m.shape()[1] != 3)
    return "the sample index is not uint32 [n, 3]";
  for (int64_t i = 0; i < m.shape()[0]; ++i) {
    const int64_t b = m.get(3 * i), e = m.get(3 * i + 1), t = m.get(3 * i + 2);
    if (b < bounds.front() || e > bounds.back() || b >= e || t < 2 || t > max_seq_length)
      return "row " + std::to_string(i) + " is outside the split's sentences";
  }
  return "";
}

MaskedLmResult create_masked_lm_predictions(std::span<const int64_t> tokens,
                                            int64_t target_sequence_length,
                                            const MaskingConfig& config, const MaskingVocab& vocab,
                                            NumpyRandomState& rng, const TokenMaskFn& token_mask) {
  // Whole-word candidates: [CLS] and [SEP] are never candidates; "##" pieces join the word.
  std::vector<std::vector<int64_t>> candidates;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t id = tokens[i];
    if (id == vocab.cls || id == vocab.sep) continue;
    MEGATRON_CHECK(id >= 0 && static_cast<size_t>(id) < vocab.continuation.size(), "token id ", id,
                   " is outside the tokenizer's vocabulary (", vocab.continuation.size(),
                   " ids); the dataset was made with another tokenizer");
    const auto pos = static_cast<int64_t>(i);
    if (vocab.continuation[static_cast<size_t>(id)] && config.masking_do_full_word &&
        !candidates.empty()) {
      candidates.back().push_back(pos);
    } else {
      candidates.push_back({pos});
    }
  }
  const double p = config.masking_probability;
  const double n_maskings =
      std::min(p * static_cast<double>(target_sequence_length),
               std::max(1.0, std::nearbyint(static_cast<double>(tokens.size()) * p)));

  const auto max_ngram = static_cast<size_t>(config.masking_max_ngram);
  std::vector<double> nprobs(max_ngram);
  for (size_t n = 0; n < max_ngram; ++n) nprobs[n] = 1.0 / static_cast<double>(n + 1);
  const double total = numpy_sum(nprobs);
  for (double& x : nprobs) x /= total;
  if (config.masking_use_longer_ngrams) std::reverse(nprobs.begin(), nprobs.end());
  // Every start has max_ngram n-grams (Megatron's slices; near the end they repeat), so the
  // distribution renormalised over them is the same for every start.
  std::vector<double> pick(nprobs);
  const double pick_total = numpy_sum(pick);
  for (double& x : pick) x /= pick_total;

  // The n-gram lists are shuffled as one list of starts: shuffling start indices draws the same.
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  rng.shuffle(std::span<size_t>(order));

  MaskedLmResult out;
  out.tokens.assign(tokens.begin(), tokens.end());
  std::vector<std::pair<int64_t, int64_t>> selected;  // (position, original id)
  std::set<int64_t> masked;
  std::vector<int64_t> ngram;
  for (size_t start : order) {
    if (static_cast<double>(selected.size()) >= n_maskings) break;
    size_t n =
        config.masking_use_geometric_distribution
            ? static_cast<size_t>(std::min<int64_t>(rng.geometric(0.2), config.masking_max_ngram))
            : static_cast<size_t>(rng.choice_index(pick)) + 1;
    bool skip = false;
    for (;;) {
      ngram.clear();
      for (size_t c = start; c < std::min(start + n, candidates.size()); ++c)
        ngram.insert(ngram.end(), candidates[c].begin(), candidates[c].end());
      --n;
      if (n_maskings >= static_cast<double>(selected.size() + ngram.size())) break;
      if (n == 0) {
        skip = true;
        break;
      }
    }
    if (skip) continue;
    if (std::any_of(ngram.begin(), ngram.end(), [&](int64_t i) { return masked.count(i) > 0; }))
      continue;
    MaskedSpan span;
    for (int64_t i : ngram) {
      masked.insert(i);
      const std::optional<int64_t> replacement = token_mask(rng);
      const int64_t original = tokens[static_cast<size_t>(i)];
      out.tokens[static_cast<size_t>(i)] = replacement ? *replacement : original;
      selected.emplace_back(i, original);
      span.positions.push_back(i);
      span.labels.push_back(original);
    }
    out.spans.push_back(std::move(span));
  }
  // Megatron shuffles the candidates again (for its permutation option) whether or not it uses
  // them; the draws are part of the stream later consumers see.
  rng.shuffle(std::span<size_t>(order));

  std::stable_sort(selected.begin(), selected.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [pos, label] : selected) {
    out.positions.push_back(pos);
    out.labels.push_back(label);
  }
  std::stable_sort(out.spans.begin(), out.spans.end(),
                   [](const MaskedSpan& a, const MaskedSpan& b) {
                     return a.positions.front() < b.positions.front();
                   });
  return out;
}

nlohmann::ordered_json masked_dataset_description(const char* cls, const std::string& dataset_path,
                                                  std::optional<int64_t> num_samples, Split split,
                                                  const GPTDatasetConfig& base,
                                                  double short_sequence_probability,
                                                  const MaskingConfig& m) {
  auto j = nlohmann::ordered_json::parse(
      gpt_dataset_description(dataset_path, num_samples, split, base));
  j["class"] = cls;
  j["masking_probability"] = m.masking_probability;
  j["short_sequence_probability"] = short_sequence_probability;
  j["masking_max_ngram"] = m.masking_max_ngram;
  j["masking_do_full_word"] = m.masking_do_full_word;
  j["masking_do_permutation"] = false;
  j["masking_use_longer_ngrams"] = m.masking_use_longer_ngrams;
  j["masking_use_geometric_distribution"] = m.masking_use_geometric_distribution;
  return j;
}

}  // namespace megatron
