// Megatron's sampling (src/inference/sampling.h): the filtered distributions against a
// restatement of sample_from_logits written here, the empirical frequencies of 20,000 draws
// against them by a chi-square test, greedy, the vocabulary clamp, seeds, and the checks.
//
// The chi-square threshold: 20,000 draws give expected counts of at least 5 in every kept cell
// for these logits, so the statistic over the kept tokens follows chi-square with (kept - 1)
// degrees of freedom; the critical values below are its 0.999 quantiles, so a correct sampler
// fails one setting with probability 1e-3 (the draws are a fixed Philox sequence: the outcome is
// the same on every run). Each test also shows the check has power: the unfiltered distribution's
// draws fail it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "inference/sampling.h"

namespace megatron::inference {
namespace {

// 0.999 quantiles of chi-square with 1..15 degrees of freedom.
constexpr double kChi2_999[] = {10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124,
                                27.877, 29.588, 31.264, 32.909, 34.528, 36.123, 37.697};
constexpr int kDraws = 20000;

const std::vector<float> kLogits = {1.5f,  -0.3f, 2.2f, 0.7f,  2.2f, -1.1f, 0.1f,  1.0f,
                                    -2.0f, 0.4f,  1.8f, -0.6f, 0.0f, 0.9f,  -1.5f, 0.3f};

// sample_from_logits restated: softmax of the scaled logits, top-k as "below the k-th largest",
// top-p by the shifted cumulative sum over the descending order (ties by index).
std::vector<double> restated(const std::vector<float>& logits, double t, int64_t k, double p) {
  const size_t n = logits.size();
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = static_cast<double>(logits[i] / static_cast<float>(t));
  std::vector<bool> keep(n, true);
  if (k > 1) {
    std::vector<double> s(z);
    std::sort(s.rbegin(), s.rend());
    for (size_t i = 0; i < n; ++i) keep[i] = z[i] >= s[static_cast<size_t>(k - 1)];
  } else if (p > 0) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
    double norm = 0;
    for (double v : z) norm += std::exp(v);
    std::vector<double> cum(n);
    double c = 0;
    for (size_t r = 0; r < n; ++r) cum[r] = c += std::exp(z[idx[r]]) / norm;
    for (size_t r = 1; r < n; ++r) keep[idx[r]] = !(cum[r - 1] > p);
  }
  std::vector<double> q(n, 0.0);
  double norm = 0;
  for (size_t i = 0; i < n; ++i)
    if (keep[i]) norm += q[i] = std::exp(z[i]);
  for (double& v : q) v /= norm;
  return q;
}

std::vector<int64_t> draw(const SamplingParams& sp, uint64_t seed) {
  std::vector<int64_t> counts(kLogits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    const double u = Philox::uniform(seed, 0, static_cast<uint64_t>(i));
    ++counts[static_cast<size_t>(sample_token(kLogits, sp, 16, u))];
  }
  return counts;
}

// Chi-square over the cells with probability > 0 (a draw in a zero cell is infinite).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& q, int* dof) {
  double x = 0;
  int cells = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] == 0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    const double e = q[i] * kDraws;
    x += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  *dof = cells - 1;
  return x;
}

struct Setting {
  float t;
  int64_t k;
  float p;
  int kept;  // tokens left after filtering (Megatron's code run in PyTorch gives the same counts)
};

TEST(Sampling, DistributionsMatchTheRestatement) {
  for (const Setting& s :
       {Setting{1.0f, 0, 0.0f, 16}, Setting{0.7f, 3, 0.0f, 3}, Setting{1.3f, 5, 0.0f, 5},
        Setting{0.8f, 0, 0.6f, 3}, Setting{1.0f, 0, 0.9f, 9}, Setting{2.0f, 0, 0.5f, 5}}) {
    SCOPED_TRACE(testing::Message() << "t " << s.t << " k " << s.k << " p " << s.p);
    const std::vector<double> got = sampling_probabilities(kLogits, {s.t, s.k, s.p});
    const std::vector<double> want = restated(kLogits, s.t, s.k, s.p);
    int kept = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-12) << i;  // both double softmaxes of the same f32 logits
      kept += want[i] > 0;
    }
    EXPECT_EQ(kept, s.kept);
  }
}

TEST(Sampling, TwentyThousandDrawsPassChiSquare) {
  for (const Setting& s :
       {Setting{1.0f, 0, 0.0f, 16}, Setting{0.7f, 3, 0.0f, 3}, Setting{1.3f, 5, 0.0f, 5},
        Setting{0.8f, 0, 0.6f, 3}, Setting{1.0f, 0, 0.9f, 9}, Setting{2.0f, 0, 0.5f, 5}}) {
    SCOPED_TRACE(testing::Message() << "t " << s.t << " k " << s.k << " p " << s.p);
    const std::vector<double> q = restated(kLogits, s.t, s.k, s.p);
    int dof = 0;
    const double x = chi_square(draw({s.t, s.k, s.p}, 42), q, &dof);
    ASSERT_GE(dof, 1);
    EXPECT_LT(x, kChi2_999[dof - 1]) << dof << " degrees of freedom";
    // Power: unfiltered draws at the same temperature fail the filtered distribution (they land
    // in dropped cells), and filtered ones fail the unfiltered distribution.
    if (s.kept < 16) {
      int d = 0;
      EXPECT_EQ(chi_square(draw({s.t, 0, 0.0f}, 42), q, &d), INFINITY);
      const double wrong = chi_square(draw({s.t, s.k, s.p}, 42), restated(kLogits, s.t, 0, 0), &d);
      EXPECT_GT(wrong, kChi2_999[d - 1]);
    }
  }
}

TEST(Sampling, GreedyIsTheFirstArgmaxAndIgnoresTemperature) {
  // 2.2 at indices 2 and 4: the lower index, as torch.argmax.
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(kLogits, {0.1f, 1, 0.0f}, 16, u), 2);
}

TEST(Sampling, TopKKeepsTiesAtTheThreshold) {
  // k = 2: the second largest is 2.2, tied at indices 2 and 4: both kept, nothing else.
  const std::vector<double> q = sampling_probabilities(kLogits, {1.0f, 2, 0.0f});
  EXPECT_NEAR(q[2], 0.5, 1e-15);
  EXPECT_NEAR(q[4], 0.5, 1e-15);
}

TEST(Sampling, TokensAreClampedToTheTokenizerVocabulary) {
  // The output layer's padded rows (here 12..15) can be drawn; they become vocab_size - 1.
  const std::vector<float> logits = {0.0f, 0.0f, 9.0f, 9.0f};
  for (int i = 0; i < 100; ++i) {
    const double u = Philox::uniform(3, 0, static_cast<uint64_t>(i));
    EXPECT_LE(sample_token(logits, {1.0f, 0, 0.0f}, 3, u), 2);
  }
  EXPECT_EQ(sample_token(logits, {1.0f, 0, 0.0f}, 3, 0.9999), 2);
}

TEST(Sampling, TheSameUniformsGiveTheSameTokens) {
  EXPECT_EQ(draw({0.9f, 0, 0.8f}, 7), draw({0.9f, 0, 0.8f}, 7));
  EXPECT_NE(draw({0.9f, 0, 0.8f}, 7), draw({0.9f, 0, 0.8f}, 8));
}

TEST(Sampling, ChecksNameTheFlag) {
  auto message = [](const SamplingParams& p) -> std::string {
    try {
      check_sampling(p, 50);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message({1.0f, 0, 0.0f}), "");
  EXPECT_EQ(message({1.0f, 1, 0.0f}), "");
  EXPECT_NE(message({0.0f, 0, 0.0f}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({101.0f, 0, 0.0f}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, 5, 0.5f}).find("top-p and top-k both"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 1.5f}).find("--top_p"), std::string::npos);
  EXPECT_NE(message({1.0f, 50, 0.0f}).find("larger than the vocabulary"), std::string::npos);
  EXPECT_NE(message({1.0f, 1001, 0.0f}).find("--top_k"), std::string::npos);
}

}  // namespace
}  // namespace megatron::inference
