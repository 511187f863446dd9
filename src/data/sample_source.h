// SampleSource: what the trainer reads samples from. Sample i is seq_length + 1 token ids (inputs
// are the first seq_length, labels the last seq_length). Implemented by GPTDataset (Megatron's
// document/sample/shuffle indices over an IndexedDataset), BlendedDataset (weighted mixture) and
// MockGPTDataset.
#pragma once

#include <cstdint>

namespace megatron {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Number of samples (a GPTDataset is built for the number of samples the run needs).
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // Writes sample `index` (seq_length + 1 ids) into out. Safe to call from several threads.
  virtual void sample(int64_t index, int64_t* out) const = 0;
};

}  // namespace megatron
