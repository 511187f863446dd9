// Fill-in-the-middle samples (--fim-data): Megatron core 0.19's GPTFIMDataset over any GPT sample
// source.
//
// Each sample (seq_length + 1 ids) is cut at the FIM EOD token (--fim-eod-token) into segments;
// each segment is, with probability --fim-rate, decoded to text (special tokens dropped: the
// added tokens tokenizer.json marks "special", where Megatron drops transformers'
// all_special_tokens, its special-token map; the two agree for tokenizers whose special added
// tokens are the map's), cut at
// two uniformly drawn character positions into prefix, middle and suffix, and written back as
//   PSM: <prefix> prefix <suffix> suffix <middle> middle, or with probability --fim-spm-rate
//   SPM: <prefix> <suffix> suffix <middle> prefix middle,
// each part encoded on its own. With --fim-split-sample the segments are cut again at that
// token (e.g. a file separator inside a repository): one --fim-rate draw decides for the whole
// segment, then each fragment is permuted with --fim-fragment-rate; fragments whose text starts
// with --fim-no-prefix stay as they are. The result is cut to the sample's length, or filled with
// --fim-pad-token. The masks and positions are made afterwards from the permuted ids, as for any
// GPT sample (data/gpt_batch.h).
//
// Megatron's quirks are kept: a segment or fragment that is empty is dropped with its EOD or
// split token unless it is the last one, and an empty last one still becomes the three sentinel
// tokens when drawn; a segment is decoded and encoded again even when the draw leaves it whole.
//
// The random draws are Megatron's (NumPy's RandomState: binomial(1, rate), randint(0, n + 1,
// size=2), binomial(1, spm_rate), in that order) but not its stream: Megatron draws from one
// RandomState(seed) per dataset object in the order its samples are read, so a sample's
// permutation depends on the data-loader workers, the data-parallel rank and the resume point.
// Here sample i of a stream draws from RandomState(fim_sample_seed(seed, stream, i)): the same
// sample in any layout, any worker count and after a resume.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/fim_config.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/numpy_random.h"
#include "data/sample_source.h"

namespace megatron {

// The token ids of the config's token strings.
struct FimTokens {
  int64_t prefix = -1, middle = -1, suffix = -1, pad = -1, eod = -1;
  int64_t split = -1;  // -1: no --fim-split-sample
};
// Looks each token up as HF's convert_tokens_to_ids does; a token the tokenizer lacks is an error
// naming its flag.
FimTokens fim_tokens(const FimConfig& config, const HuggingFaceTokenizer& tokenizer);

// The permuted sample: the same length as `sample`, drawn from `rng` as described above.
std::vector<int64_t> fim_sample(std::span<const int64_t> sample, const FimConfig& config,
                                const FimTokens& tokens, const HuggingFaceTokenizer& tokenizer,
                                NumpyRandomState& rng);

// The RandomState seed of sample `index` of stream `stream` (a split, or one of several
// validation sets) under --seed `seed`: the low 32 bits of SplitMix64 over the three.
uint32_t fim_sample_seed(int64_t seed, int64_t stream, int64_t index);

// `base`'s samples, each through fim_sample with its own RandomState. The tokenizer must outlive
// it; sample() is safe to call from several threads.
class FimSampleSource : public SampleSource {
 public:
  FimSampleSource(std::unique_ptr<SampleSource> base, FimConfig config, FimTokens tokens,
                  const HuggingFaceTokenizer& tokenizer, int64_t seed, int64_t stream);

  int64_t size() const override { return base_->size(); }
  int64_t seq_length() const override { return base_->seq_length(); }
  void sample(int64_t index, int64_t* out) const override;

 private:
  std::unique_ptr<SampleSource> base_;
  FimConfig config_;
  FimTokens tokens_;
  const HuggingFaceTokenizer& tokenizer_;
  int64_t seed_, stream_;
};

}  // namespace megatron
