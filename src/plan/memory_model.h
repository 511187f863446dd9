// Bytes of weights, gradients and optimizer state per parameter: the one rule the planner, the
// trainer's start-up estimate and its memory report share.
//
// The bytes our buffers really take per parameter on a rank: fp32 main weights (4), the 16-bit
// compute copy in --bf16/--fp16 runs (2), fp32 gradients (4) and the two fp32 Adam moments (8),
// i.e. 16 bytes in fp32 runs and 18 in mixed precision (Megatron's 18), each divided by the
// data-parallel size where this rank keeps only a shard of it: the moments with the distributed
// optimizer (and the fp32 main weights too in mixed precision: 6 + 12/dp, Megatron's figure),
// the gradients and weights under Megatron-FSDP's sharding strategies.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace megatron {

// Which of a rank's buffers hold only a 1/shards share.
struct ShardedState {
  bool moments = false;  // the Adam moments (the distributed optimizer)
  bool main = false;     // the fp32 main weights
  bool grads = false;    // the fp32 gradients (Megatron-FSDP optim_grads and up)
  bool compute = false;  // the 16-bit compute copy (optim_grads_params)
  // Bytes of the optimizer state per parameter: Adam's two moments, 8 in fp32, fewer with the
  // precision-aware optimizer's storage (--exp-avg-dtype, --exp-avg-sq-dtype: 2 for bf16/fp16, 1
  // for fp8 each); SGD's momentum buffer 4, or 0 without momentum.
  double moment_bytes = 8.0;
};
// Bytes of weights, gradients and optimizer state per parameter on one rank, the sharded kinds
// split over `shards` data-parallel ranks.
double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t shards = 1,
                                            ShardedState sharded = {});

}  // namespace megatron
