// Megatron's fill-in-the-middle permutation (megatron/training/datasets/fim_dataset.py), its
// draws in its order, over the text of the Hugging Face tokenizer.
#include "data/fim_dataset.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace megatron {

namespace {

using Ids = std::vector<int64_t>;

void append(Ids* out, const Ids& part) {
  out->insert(out->end(), part.begin(), part.end());
}

// Byte offsets of the code points of valid UTF-8 text, and its size last: Python's string
// indices (decode() repairs invalid UTF-8, so every lead byte starts a code point).
std::vector<size_t> code_point_offsets(const std::string& text) {
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) at.push_back(i);
  }
  at.push_back(text.size());
  return at;
}

class Permuter {
 public:
  Permuter(const FimConfig& config, const FimTokens& tokens, const HuggingFaceTokenizer& tokenizer,
           NumpyRandomState& rng)
      : c_(config), t_(tokens), tok_(tokenizer), rng_(rng) {}

  // _fim_split_and_permute_sequence.
  Ids split_and_permute(std::span<const int64_t> seq) {
    if (t_.split < 0 || std::find(seq.begin(), seq.end(), t_.split) == seq.end())
      return permute(seq, c_.rate);
    if (!rng_.binomial_one(c_.rate)) return {seq.begin(), seq.end()};
    const double rate = *c_.fragment_rate;
    Ids out;
    size_t begin = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] != t_.split) continue;
      if (i > begin) {
        append(&out, permute(seq.subspan(begin, i - begin), rate));
        out.push_back(t_.split);
      }
      begin = i + 1;
    }
    append(&out, permute(seq.subspan(begin), rate));
    return out;
  }

 private:
  // _permute with truncate_or_pad=False, as the dataset calls it.
  Ids permute(std::span<const int64_t> seq, double rate) {
    if (!rng_.binomial_one(rate)) return {seq.begin(), seq.end()};
    const std::string text = tok_.decode_skipping_special(seq);
    if (c_.no_prefix && text.starts_with(*c_.no_prefix)) return {seq.begin(), seq.end()};
    const std::vector<size_t> at = code_point_offsets(text);
    const auto n = static_cast<int64_t>(at.size()) - 1;
    // randint(low=0, high=n + 1, size=2), sorted.
    int64_t lo = rng_.randint(0, n + 1), hi = rng_.randint(0, n + 1);
    if (lo > hi) std::swap(lo, hi);
    const size_t a = at[static_cast<size_t>(lo)], b = at[static_cast<size_t>(hi)];
    const Ids prefix = tok_.encode(std::string_view(text).substr(0, a));
    const Ids middle = tok_.encode(std::string_view(text).substr(a, b - a));
    const Ids suffix = tok_.encode(std::string_view(text).substr(b));
    Ids out;
    if (rng_.binomial_one(c_.spm_rate)) {  // SPM
      out = {t_.prefix, t_.suffix};
      append(&out, suffix);
      out.push_back(t_.middle);
      append(&out, prefix);
      append(&out, middle);
    } else {  // PSM
      out = {t_.prefix};
      append(&out, prefix);
      out.push_back(t_.suffix);
      append(&out, suffix);
      out.push_back(t_.middle);
      append(&out, middle);
    }
    return out;
  }

  const FimConfig& c_;
  const FimTokens& t_;
  const HuggingFaceTokenizer& tok_;
  NumpyRandomState& rng_;
};

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void validate_fim_config(const FimConfig& c) {
  auto rate = [](const char* flag, double v) {
    MEGATRON_CHECK(v >= 0 && v <= 1, flag, " ", v, " is no probability; pass a value in [0, 1]");
  };
  rate("--fim-rate", c.rate);
  rate("--fim-spm-rate", c.spm_rate);
  if (c.fragment_rate) rate("--fim-fragment-rate", *c.fragment_rate);
  MEGATRON_CHECK(c.split_sample.empty() || c.fragment_rate.has_value(),
                 "--fim-split-sample permutes each fragment with --fim-fragment-rate; pass it "
                 "too (Megatron fails on its absence)");
}

FimTokens fim_tokens(const FimConfig& c, const HuggingFaceTokenizer& tokenizer) {
  auto id = [&](const char* flag, const std::string& token) {
    const int64_t found = tokenizer.token_to_id(token);
    MEGATRON_CHECK(found >= 0, flag, " ", token, " is no token of the tokenizer (",
                   tokenizer.identity(),
                   "); pass the tokenizer's own fill-in-the-middle tokens (e.g. StarCoder's "
                   "<fim_prefix>, <fim_middle>, <fim_suffix>, <fim_pad>) or add them to its "
                   "added_tokens");
    return found;
  };
  FimTokens t;
  t.prefix = id("--fim-prefix-token", c.prefix_token);
  t.middle = id("--fim-middle-token", c.middle_token);
  t.suffix = id("--fim-suffix-token", c.suffix_token);
  t.pad = id("--fim-pad-token", c.pad_token);
  t.eod = id("--fim-eod-token", c.eod_token);
  if (!c.split_sample.empty()) t.split = id("--fim-split-sample", c.split_sample);
  return t;
}

std::vector<int64_t> fim_sample(std::span<const int64_t> sample, const FimConfig& config,
                                const FimTokens& tokens, const HuggingFaceTokenizer& tokenizer,
                                NumpyRandomState& rng) {
  Permuter p(config, tokens, tokenizer, rng);
  Ids out;
  if (std::find(sample.begin(), sample.end(), tokens.eod) == sample.end()) {
    out = p.split_and_permute(sample);
  } else {
    size_t begin = 0;
    for (size_t i = 0; i < sample.size(); ++i) {
      if (sample[i] != tokens.eod) continue;
      if (i > begin) {  // empty segments vanish with their EOD, as in Megatron
        append(&out, p.split_and_permute(sample.subspan(begin, i - begin)));
        out.push_back(tokens.eod);
      }
      begin = i + 1;
    }
    append(&out, p.split_and_permute(sample.subspan(begin)));
  }
  out.resize(sample.size(), tokens.pad);
  return out;
}

uint32_t fim_sample_seed(int64_t seed, int64_t stream, int64_t index) {
  const uint64_t h = splitmix64(
      splitmix64(splitmix64(static_cast<uint64_t>(seed)) + static_cast<uint64_t>(stream)) +
      static_cast<uint64_t>(index));
  return static_cast<uint32_t>(h);
}

FimSampleSource::FimSampleSource(std::unique_ptr<SampleSource> base, FimConfig config,
                                 FimTokens tokens, const HuggingFaceTokenizer& tokenizer,
                                 int64_t seed, int64_t stream)
    : base_(std::move(base)),
      config_(std::move(config)),
      tokens_(tokens),
      tokenizer_(tokenizer),
      seed_(seed),
      stream_(stream) {
  MEGATRON_ASSERT(base_ != nullptr, "FimSampleSource needs samples");
  validate_fim_config(config_);
}

void FimSampleSource::sample(int64_t index, int64_t* out) const {
  const int64_t width = base_->sample_width();
  std::vector<int64_t> raw(static_cast<size_t>(width));
  base_->sample(index, raw.data());
  NumpyRandomState rng(fim_sample_seed(seed_, stream_, index));
  const Ids permuted = fim_sample(raw, config_, tokens_, tokenizer_, rng);
  std::copy(permuted.begin(), permuted.end(), out);
}

}  // namespace megatron
