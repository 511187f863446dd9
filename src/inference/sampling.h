// Next-token sampling, Megatron's `sample_from_logits` (the static engine's
// TextGenerationController; the legacy `sampling.sample` is the same logic):
//
//   top_k == 1:  argmax of the raw logits (temperature ignored); the lowest index among ties.
//   otherwise:   logits / temperature, then either top-k filtering (logits below the k-th largest
//                dropped; ties at the threshold kept) or top-p filtering (sorted descending,
//                softmax, cumulative sum; a token is dropped when the cumulative probability of
//                the tokens before it already exceeds p, so the token that crosses p is kept and
//                the first always is), never both; softmax over what is left; one draw; the
//                token clamped to the tokenizer's vocabulary [0, vocab_size) (a draw from the
//                output layer's padded rows becomes vocab_size - 1).
//   top_k == 0 and top_p == 0: plain sampling at the temperature.
//
// One deviation: the greedy token is clamped too (Megatron clamps only sampled ones), so a padded
// row can never come out as a token id the tokenizer does not have.
//
// Where Megatron leaves it to the library: top-p sorts ties by index (torch.sort is not stable),
// and the softmax is computed in double. The draw is the inverse CDF of a uniform u in [0, 1) that
// the caller supplies (a counter-based Philox value of (seed, prompt, position)), so a seed gives
// the same tokens on every rank, batch composition and thread count.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace megatron::inference {

struct SamplingParams {
  float temperature = 1.0f;
  int64_t top_k = 0;
  float top_p = 0.0f;
};

// Megatron's checks (the controller's asserts and the server's ranges), as InvalidArgument naming
// the flag: temperature in (0, 100], top_k in [0, 1000] and below the vocabulary size, top_p in
// [0, 1], and not top_k > 0 together with top_p > 0.
void check_sampling(const SamplingParams& p, int64_t vocab_size);

// The distribution a draw samples from over all logits (zero where filtered); for top_k != 1.
std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingParams& p);

// One token for one row of logits ([padded vocab]); u uniform in [0, 1).
int64_t sample_token(std::span<const float> logits, const SamplingParams& p, int64_t vocab_size,
                     double u);

}  // namespace megatron::inference
