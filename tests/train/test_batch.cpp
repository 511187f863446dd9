// Micro-batch construction and sampling: Megatron's masks and position ids around end-of-document
// tokens, and the sampler's order (prefetching and data-parallel sharding never change which
// samples a micro-batch holds).
#include <gtest/gtest.h>

#include <vector>

#include "data/gpt_batch.h"
#include "train/batch_prefetcher.h"

namespace megatron {
namespace {

// Sample i is seq_length + 1 consecutive ids of an arithmetic stream, with EOD (= 7, not 0, so a
// confusion of EOD with the zero id shows) at every 5th position.
constexpr int64_t kEod = 7;

class StreamSource : public SampleSource {
 public:
  StreamSource(int64_t n, int64_t s) : n_(n), s_(s) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return s_; }
  void sample(int64_t index, int64_t* out) const override {
    for (int64_t t = 0; t <= s_; ++t) {
      const int64_t pos = index * s_ + t;
      out[t] = pos % 5 == 4 ? kEod : 100 + pos;
    }
  }

 private:
  int64_t n_, s_;
};

TEST(GPTBatch, MasksAndPositionsFollowMegatron) {
  StreamSource src(4, 8);
  BatchOptions opt{kEod, true, true, true};
  GPTBatch b = make_batch(src, 1, 1, opt);
  // Sample 1 covers stream positions 8..16: EOD at 9 and 14 (inputs t = 1 and 6).
  const int64_t want_tokens[] = {108, kEod, 110, 111, 112, 113, kEod, 115};
  const int64_t want_pos[] = {0, 1, 0, 1, 2, 3, 4, 0};    // restart after each EOD
  const int32_t want_start[] = {0, 0, 2, 2, 2, 2, 2, 7};  // the EOD ends its document
  const float want_mask[] = {1, 0, 1, 1, 1, 1, 0, 1};     // no loss on EOD inputs
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(b.tokens.data<int64_t>()[t], want_tokens[t]) << t;
    EXPECT_EQ(b.labels.data<int64_t>()[t], t == 7 ? 116 : want_tokens[t + 1]) << t;
    EXPECT_EQ(b.positions.data<int64_t>()[t], want_pos[t]) << t;
    EXPECT_EQ(b.doc_start.data<int32_t>()[t], want_start[t]) << t;
    EXPECT_EQ(b.loss_mask.data<float>()[t], want_mask[t]) << t;
  }
  GPTBatch plain = make_batch(src, 1, 1, BatchOptions{kEod, false, false, false});
  EXPECT_FALSE(plain.doc_start.defined());
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(plain.positions.data<int64_t>()[t], t);
    EXPECT_EQ(plain.loss_mask.data<float>()[t], 1.0f);
  }
}

// Every token of the next n micro-batches, flattened.
std::vector<int64_t> all_tokens(BatchPrefetcher& p, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    const Tensor tokens = p.next().at(kTokens);
    out.insert(out.end(), tokens.data<int64_t>(), tokens.data<int64_t>() + tokens.numel());
  }
  return out;
}

// The tokens of samples [first, first + count) as a micro-batch holds them.
std::vector<int64_t> tokens_of(const SampleSource& src, int64_t first, int64_t count) {
  std::vector<int64_t> out, buf(static_cast<size_t>(src.seq_length() + 1));
  for (int64_t i = first; i < first + count; ++i) {
    src.sample(i, buf.data());
    out.insert(out.end(), buf.begin(), buf.end() - 1);
  }
  return out;
}

TEST(BatchPrefetcher, PrefetchingAndShardingKeepMegatronsSampleOrder) {
  StreamSource src(64, 3);
  const BatchOptions options{kEod, false, false, false};
  const BatchFn opt = [options](const SampleSource& data, int64_t first, int64_t b) {
    return gpt_batch_fields(make_batch(data, first, b, options));
  };
  BatchPrefetcher sync(src, opt, 2, 4, 0), ahead(src, opt, 2, 4, 3);
  const std::vector<int64_t> got = all_tokens(sync, 10);
  EXPECT_EQ(got, all_tokens(ahead, 10));
  EXPECT_EQ(got, tokens_of(src, 4, 20));  // resumed at 4 consumed samples, in order
  // dp = 2, micro-batch 2, resuming from 4 consumed samples: rank 0 takes samples 4-5, 8-9, ...;
  // rank 1 takes 6-7, 10-11, ...
  BatchPrefetcher r0(src, opt, 2, 4, 2, 0, 2), r1(src, opt, 2, 4, 2, 1, 2);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(all_tokens(r0, 1), tokens_of(src, 4 + 4 * k, 2)) << "rank 0, micro-batch " << k;
    EXPECT_EQ(all_tokens(r1, 1), tokens_of(src, 4 + 4 * k + 2, 2)) << "rank 1, micro-batch " << k;
  }
}

TEST(BatchPrefetcher, ExhaustedSourceIsAnErrorNotAHang) {
  StreamSource src(4, 3);
  BatchPrefetcher p(
      src,
      [](const SampleSource& data, int64_t first, int64_t b) {
        return gpt_batch_fields(make_batch(data, first, b, BatchOptions{}));
      },
      2, 0, 2);
  p.next();
  p.next();
  EXPECT_THROW(p.next(), InvalidArgument);
}

}  // namespace
}  // namespace megatron
