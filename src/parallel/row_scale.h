// RowScale: factors for the rows of a Param's local tensor (its first dimension), applied to the
// fp32 main weights after an optimizer update. MuonClip's qk-clip (train/qk_clip.h) shrinks the
// query and key rows of the attention projections this way.
//
// Where the main weights are whole on every rank (no distributed optimizer, or fp32 runs after
// its all-gather) every rank scales them alike and refreshes its compute copy from them; the
// distributed optimizer scales the owned shards before it rounds and gathers them
// (DistributedOptimizer::step). Either way the compute copy is the rounded scaled main weights,
// as after any update, so that replicas agree and a checkpoint resumes bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/param.h"

namespace megatron {

struct RowScale {
  const Param* param = nullptr;
  std::vector<float> factors;  // one per row of param->shape (dim 0)
};

// Multiplies the elements [begin, begin + w.numel()) of s.param's local tensor (row-major), held
// in w (f32, any shape), each by the factor of its row, rounding each product once in f32.
void scale_rows_of(Tensor w, const RowScale& s, int64_t begin);

// Whole main weights: every scale applied to its Param's main weights, then the Param's compute
// copy refreshed from them. Frozen Params are never scaled (nothing trains them).
void scale_main_rows(ParamSet& params, const std::vector<RowScale>& scales);

}  // namespace megatron
