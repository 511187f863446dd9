// Reading a validation set whole: see the header.
#include "train/full_validation.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "data/gpt_batch.h"

namespace megatron {

int64_t WrappedSource::size() const {
  return std::numeric_limits<int64_t>::max() / 2;
}

void mask_rows_from(TensorMap& batch, int64_t row) {
  Tensor mask = batch.at(kLossMask);  // a handle: writes go to the batch's tensor
  MEGATRON_ASSERT(mask.ndim() == 2 && mask.dtype() == DType::kF32, "loss_mask is [b, s] f32");
  const int64_t b = mask.dim(0), s = mask.dim(1);
  if (row >= b) return;
  float* m = mask.data<float>();
  std::fill(m + std::max<int64_t>(row, 0) * s, m + b * s, 0.0f);
}

}  // namespace megatron
