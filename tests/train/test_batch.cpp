// Micro-batch construction and sampling: Megatron's masks and position ids around end-of-document
// tokens, and the sampler's order (prefetching and data-parallel sharding never change which
// samples a micro-batch holds).
#include <gtest/gtest.h>

#include <vector>

#include "data/gpt_batch.h"
#include "train/batch_prefetcher.h"

namespace megatron {
namespace {

// Sample i is seq_length + 1 consecutive ids of an arithmetic stream, with EOD (= 0) every 5th.
class StreamSource : public SampleSource {
 public:
  StreamSource(int64_t n, int64_t s) : n_(n), s_(s) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return s_; }
  void sample(int64_t index, int64_t* out) const override {
    for (int64_t t = 0; t <= s_; ++t) {
      const int64_t pos = index * s_ + t;
      out[t] = pos % 5 == 4 ? 0 : 100 + pos;
    }
  }

 private:
  int64_t n_, s_;
};

TEST(GPTBatch, MasksAndPositionsFollowMegatron) {
  StreamSource src(4, 8);
  BatchOptions opt{0, true, true, true};
  GPTBatch b = make_batch(src, 1, 1, opt);
  // Sample 1 covers stream positions 8..16: EOD at 9 and 14 (inputs t = 1 and 6).
  const int64_t want_tokens[] = {108, 0, 110, 111, 112, 113, 0, 115};
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
  GPTBatch plain = make_batch(src, 1, 1, BatchOptions{0, false, false, false});
  EXPECT_FALSE(plain.doc_start.defined());
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(plain.positions.data<int64_t>()[t], t);
    EXPECT_EQ(plain.loss_mask.data<float>()[t], 1.0f);
  }
}

std::vector<int64_t> first_tokens(BatchPrefetcher& p, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(p.next().tokens.data<int64_t>()[0]);
  return out;
}

TEST(BatchPrefetcher, PrefetchingAndShardingKeepMegatronsSampleOrder) {
  StreamSource src(64, 3);
  BatchOptions opt{0, false, false, false};
  BatchPrefetcher sync(src, opt, 2, 4, 0), ahead(src, opt, 2, 4, 3);
  EXPECT_EQ(first_tokens(sync, 10), first_tokens(ahead, 10));
  // dp = 2, micro-batch 2, resuming from 4 consumed samples: rank 0 takes samples 4-5, 8-9, ...;
  // rank 1 takes 6-7, 10-11, ...
  BatchPrefetcher r0(src, opt, 2, 4, 2, 0, 2), r1(src, opt, 2, 4, 2, 1, 2);
  for (int k = 0; k < 5; ++k) {
    GPTBatch a = r0.next(), b = r1.next();
    std::vector<int64_t> buf(4);
    src.sample(4 + 4 * k, buf.data());
    EXPECT_EQ(a.tokens.data<int64_t>()[0], buf[0]);
    src.sample(4 + 4 * k + 2, buf.data());
    EXPECT_EQ(b.tokens.data<int64_t>()[0], buf[0]);
  }
}

TEST(BatchPrefetcher, ExhaustedSourceIsAnErrorNotAHang) {
  StreamSource src(4, 3);
  BatchPrefetcher p(src, BatchOptions{}, 2, 0, 2);
  p.next();
  p.next();
  EXPECT_THROW(p.next(), InvalidArgument);
}

}  // namespace
}  // namespace megatron
