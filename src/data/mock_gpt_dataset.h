// MockGPTDataset: synthetic training data for --mock-data, after Megatron's mock dataset.
//
// Documents have pseudo-random lengths in [1, 4096) and content 1, 2, ..., len - 1 followed by
// the end-of-document token, concatenated into one stream that samples of seq_length + 1 tokens
// are cut from (consecutive samples overlap by one token, as Megatron's GPT samples do). Token t
// is stored as t mod eod so every id is in the vocabulary. A model learns the "+1" rule quickly,
// so the loss falls visibly: it is for smoke runs and benchmarks, not for modelling. It follows
// Megatron's mock documents, not its exact sample order.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sample_source.h"

namespace megatron {

class MockGPTDataset : public SampleSource {
 public:
  // Covers `num_samples` samples; sample(i) for larger i is an error.
  MockGPTDataset(int64_t num_samples, int64_t seq_length, int64_t eod, uint64_t seed);

  int64_t size() const override { return num_samples_; }
  int64_t seq_length() const override { return seq_length_; }
  void sample(int64_t index, int64_t* out) const override;
  std::vector<int64_t> document_lengths(int64_t index) const override;

 private:
  int64_t num_samples_, seq_length_, eod_;
  std::vector<int64_t> doc_starts_{0};  // prefix sums of document lengths, past the last sample
};

}  // namespace megatron
