// MockGPTDataset: synthetic training data for --mock-data, after Megatron's mock dataset.
//
// Documents have pseudo-random lengths in [1, 4096) and content 1, 2, ..., len - 1 followed by
// the end-of-document token, concatenated into one stream that samples of seq_length + 1 tokens
// are cut from (consecutive samples overlap by one token, as Megatron's GPT samples do). Token t
// is stored as t mod eod so every id is in the vocabulary. A model learns the "+1" rule quickly,
// so the loss falls visibly: it is for smoke runs and benchmarks, not for modelling. Everything is
// a pure function of (seed, sample index), so any rank can read any sample.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace megatron {

class MockGPTDataset {
 public:
  MockGPTDataset(int64_t seq_length, int64_t eod, uint64_t seed);

  // Writes sample `index` ([seq_length + 1] tokens) into out.
  void sample(int64_t index, int64_t* out);
  int64_t seq_length() const { return seq_length_; }
  int64_t eod() const { return eod_; }

 private:
  // Document containing stream position pos, and pos's offset in it.
  void locate(int64_t pos, int64_t& doc, int64_t& offset);

  int64_t seq_length_, eod_;
  uint64_t seed_;
  std::vector<int64_t> doc_starts_{0};  // prefix sums of document lengths, grown on demand
};

// A micro-batch in Megatron's layout: tokens and labels are [b, s] i64 (labels = tokens shifted by
// one), loss_mask [b, s] f32 (0 where the input token is EOD under --eod-mask-loss).
struct GPTBatch {
  Tensor tokens, labels, loss_mask;
};

// Builds a batch from `b` consecutive samples starting at sample `first`.
GPTBatch make_batch(MockGPTDataset& data, int64_t first, int64_t b, bool eod_mask_loss);

}  // namespace megatron
