// Megatron's sampling (sampling.h): greedy, temperature, top-k or top-p, clamp.
#include "inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace megatron::inference {

void check_sampling(const SamplingParams& p, int64_t vocab_size) {
  MEGATRON_CHECK(p.temperature > 0.0f && p.temperature <= 100.0f, "--temperature ", p.temperature,
                 " must be in (0, 100]");
  MEGATRON_CHECK(p.top_k >= 0 && p.top_k <= 1000, "--top_k ", p.top_k, " must be in [0, 1000]");
  MEGATRON_CHECK(p.top_p >= 0.0f && p.top_p <= 1.0f, "--top_p ", p.top_p,
                 " must be in [0, 1] (top-p should be in (0,1], 0 turns it off)");
  MEGATRON_CHECK(!(p.top_k > 0 && p.top_p > 0.0f), "--top_k ", p.top_k, " and --top_p ", p.top_p,
                 ": cannot have top-p and top-k both greater than zero; set one of them to 0");
  MEGATRON_CHECK(p.top_k <= 1 || p.top_k < vocab_size, "--top_k ", p.top_k,
                 " is larger than the vocabulary size ", vocab_size);
}

std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingParams& p) {
  const auto n = static_cast<int64_t>(logits.size());
  MEGATRON_CHECK(n > 0, "sampling: no logits");
  MEGATRON_CHECK(p.top_k <= n, "sampling: top-k ", p.top_k, " is larger than the logit size ", n);
  constexpr float kDropped = -std::numeric_limits<float>::infinity();
  std::vector<float> z(logits.begin(), logits.end());
  // Divided in f32, as Megatron divides the f32 logits in place.
  if (p.temperature != 1.0f)
    for (float& v : z) v /= p.temperature;
  if (p.top_k > 1) {
    std::vector<float> sorted(z);
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(),
                     std::greater<float>());
    const float kth = sorted[static_cast<size_t>(p.top_k - 1)];
    for (float& v : z)
      if (v < kth) v = kDropped;
  } else if (p.top_p > 0.0f) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    const double top = z[order[0]];
    double total = 0;
    for (float v : z) total += std::exp(static_cast<double>(v) - top);
    // Kept while the probability of the tokens before this one is at most p.
    double before = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = order[i];
      const double q = std::exp(static_cast<double>(z[t]) - top) / total;
      if (i > 0 && before > p.top_p) z[t] = kDropped;
      before += q;
    }
  }
  const double top = *std::max_element(z.begin(), z.end());
  std::vector<double> probs(static_cast<size_t>(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    probs[i] = z[i] == kDropped ? 0.0 : std::exp(static_cast<double>(z[i]) - top);
    total += probs[i];
  }
  for (double& q : probs) q /= total;
  return probs;
}

int64_t sample_token(std::span<const float> logits, const SamplingParams& p, int64_t vocab_size,
                     double u) {
  MEGATRON_CHECK(vocab_size > 0, "sampling: vocabulary size ", vocab_size);
  int64_t token = 0;
  if (p.top_k == 1) {
    token = std::max_element(logits.begin(), logits.end()) - logits.begin();
  } else {
    const std::vector<double> probs = sampling_probabilities(logits, p);
    // Inverse CDF; the last token with probability > 0 takes what rounding leaves above the sum.
    double cum = 0;
    token = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] == 0.0) continue;
      token = static_cast<int64_t>(i);
      cum += probs[i];
      if (u < cum) break;
    }
  }
  return std::clamp<int64_t>(token, 0, vocab_size - 1);
}

}  // namespace megatron::inference
