// --full-validation: an evaluation that reads every sample of the validation set exactly once.
//
// The evaluation keeps the run's micro-batch size and micro-batches per step, and reads the set
// in order with the single sampler's layout (micro-step j, data-parallel rank r: samples
// [(j dp + r) b, (j dp + r + 1) b)). The last step runs past the end of the set: those positions
// re-read samples from its start (WrappedSource) with their loss mask zeroed (mask_rows_from),
// so the token-weighted mean is over the set's samples, each once, on any layout.
#pragma once

#include <cstdint>

#include "data/sample_source.h"
#include "tensor/tensor_map.h"

namespace megatron {

// Position p of `inner` read as sample p mod inner.size(); endless.
class WrappedSource : public SampleSource {
 public:
  explicit WrappedSource(const SampleSource& inner) : inner_(inner) {}
  int64_t size() const override;
  int64_t seq_length() const override { return inner_.seq_length(); }
  int64_t sample_width() const override { return inner_.sample_width(); }
  void sample(int64_t index, int64_t* out) const override {
    inner_.sample(index % inner_.size(), out);
  }
  std::vector<int64_t> document_lengths(int64_t index) const override {
    return inner_.document_lengths(index % inner_.size());
  }

 private:
  const SampleSource& inner_;
};

// Global batches (of `per_step` samples) one pass over `samples` takes.
inline int64_t full_validation_steps(int64_t samples, int64_t per_step) {
  return (samples + per_step - 1) / per_step;
}

// Zeroes the loss mask ("loss_mask", [b, s]) of the batch's rows from `row` on.
void mask_rows_from(TensorMap& batch, int64_t row);

}  // namespace megatron
