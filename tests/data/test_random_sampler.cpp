// --dataloader-type cyclic against Megatron's random sampler restated over PyTorch's own
// torch.randperm (random_sampler_oracle.py): every rank's micro-batches over several epochs, from
// the start and resumed mid-epoch, with and without data sharding; and torch_randperm itself.
#include <cstdlib>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/random_sampler.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using Json = nlohmann::json;

// Sample i holds the value i: what SampledSource returns names the index it read.
class Numbered : public SampleSource {
 public:
  explicit Numbered(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return 0; }
  void sample(int64_t index, int64_t* out) const override {
    ASSERT_LT(index, n_);
    out[0] = index;
  }

 private:
  int64_t n_;
};

struct Case {
  std::string name;
  int64_t total, mbs, dp;
  bool sharding;
  int64_t consumed, batches;
};

TEST(RandomSampler, EqualsMegatronsSamplerOverTorchRandperm) {
  // Each case crosses at least two epoch boundaries. The unsharded ones keep (total / mbs) mbs -
  // active <= (mbs - 1) dp, where Megatron's ranks stay on the same micro-step (random_sampler.h).
  const std::vector<Case> cases = {
      {"sharded_dp1", 50, 4, 1, true, 0, 40},           // 2 samples dropped per epoch
      {"sharded_dp2_resumed", 40, 3, 2, true, 12, 30},  // resumed mid-epoch
      {"sharded_dp4_mbs1", 10, 1, 4, true, 0, 9},
      {"sharded_dp2_late_epoch", 37, 2, 2, true, 180, 25},
      {"unsharded_dp2", 23, 2, 2, false, 8, 30},
      {"unsharded_dp1", 17, 5, 1, false, 0, 12},
      {"unsharded_dp3", 31, 2, 3, false, 0, 20},
  };
  const std::vector<std::pair<int64_t, uint64_t>> perms = {
      {0, 0}, {1, 5}, {10, 0}, {1000, 7}, {4097, 123456789}};
  Json spec = {{"cases", Json::array()}, {"perms", Json::array()}};
  for (const Case& c : cases) {
    spec["cases"].push_back({{"name", c.name},
                             {"total", c.total},
                             {"mbs", c.mbs},
                             {"dp", c.dp},
                             {"sharding", c.sharding},
                             {"consumed", c.consumed},
                             {"batches", c.batches}});
  }
  for (const auto& [n, seed] : perms) spec["perms"].push_back({n, seed});
  const std::string dir = testing::scratch_dir("random_sampler_oracle");
  std::ofstream(dir + "/spec.json") << spec.dump();
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_SAMPLER_ORACLE +
                          " --spec " + dir + "/spec.json --out " + dir + "/result.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(dir + "/result.json");
  const Json want = Json::parse(in);

  for (size_t i = 0; i < perms.size(); ++i) {
    EXPECT_EQ(torch_randperm(perms[i].first, perms[i].second),
              want.at("perms")[i].get<std::vector<int64_t>>())
        << "n " << perms[i].first << " seed " << perms[i].second;
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const SampledSource source(std::make_unique<Numbered>(c.total), c.mbs, c.dp, c.sharding);
    const Json& ranks = want.at("cases").at(c.name);
    ASSERT_EQ(static_cast<int64_t>(ranks.size()), c.dp);
    for (int64_t r = 0; r < c.dp; ++r) {
      const Json& batches = ranks[static_cast<size_t>(r)];
      ASSERT_EQ(static_cast<int64_t>(batches.size()), c.batches);
      for (int64_t k = 0; k < c.batches; ++k) {
        for (int64_t t = 0; t < c.mbs; ++t) {
          // The trainer's position of rank r's sample t in micro-step k (batch_prefetcher.h).
          const int64_t position = c.consumed + (k * c.dp + r) * c.mbs + t;
          int64_t got = -1;
          source.sample(position, &got);
          ASSERT_EQ(got, batches[static_cast<size_t>(k)][static_cast<size_t>(t)].get<int64_t>())
              << "rank " << r << " micro-step " << k << " sample " << t;
        }
      }
    }
  }
}

TEST(RandomSampler, EpochsAreWholePermutationsOfTheActiveSamples) {
  // Without oracle: with data sharding each rank reads every sample of its bucket once per epoch.
  const int64_t total = 29, mbs = 2, dp = 3;  // active 24, bucket 8 per rank, 5 never read
  const RandomSampler s(total, mbs, dp, /*data_sharding=*/true);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(static_cast<size_t>(total), 0);
    for (int64_t p = epoch * 24; p < (epoch + 1) * 24; ++p) {
      EXPECT_EQ(s.epoch_of(p), epoch);
      ++seen[static_cast<size_t>(s.index(p))];
    }
    for (int64_t i = 0; i < total; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i < 24 ? 1 : 0);
  }
}

TEST(RandomSampler, RefusesADatasetSmallerThanOneMicroStep) {
  try {
    RandomSampler(5, 2, 3, true);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--dataloader-type cyclic"), std::string::npos);
  }
}

}  // namespace
}  // namespace megatron
