// Memory accounting of a training rank: Megatron's start-up estimate of the weight and optimizer
// memory, and the measured resident memory of this process (Megatron reports the CUDA
// allocator's; on CPUs the resident set is what the machine sees).
//
// The estimate counts the bytes our buffers really take per parameter on this rank: fp32 main
// weights (4), the 16-bit compute copy in --bf16/--fp16 runs (2), fp32 gradients (4) and the two
// fp32 Adam moments (8), i.e. 16 bytes in fp32 runs and 18 in mixed precision (Megatron's 18),
// each divided by the data-parallel size where this rank keeps only a shard of it: the moments
// with the distributed optimizer (and the fp32 main weights too in mixed precision: 6 + 12/dp,
// Megatron's figure), the gradients and weights under Megatron-FSDP's sharding strategies.
// The activation estimate (each model's, e.g. models/gpt/gpt_memory.h) counts what its layers
// keep for backward per micro-batch times the micro-batches a stage holds at once under its
// pipeline schedule; the measured peak is printed once, after the first logging interval.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace megatron {

// Which of a rank's buffers hold only a 1/shards share.
struct ShardedState {
  bool moments = false;  // the Adam moments (the distributed optimizer)
  bool main = false;     // the fp32 main weights
  bool grads = false;    // the fp32 gradients (Megatron-FSDP optim_grads and up)
  bool compute = false;  // the 16-bit compute copy (optim_grads_params)
};
// Bytes of weights, gradients and optimizer state per parameter on one rank, the sharded kinds
// split over `shards` data-parallel ranks.
double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t shards = 1,
                                            ShardedState sharded = {});
// Megatron's "Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB,
// total=%.2f MB" for `params` parameters and `activation_bytes`; `fp8_weights` of the parameters
// are FP8 primary weights (--fp8-param-gather), whose compute copy is one byte, not two.
// frozen: the parameters without gradients (--freeze-LM, --freeze-ViT), which hold their fp32
// main and compute copies whole and nothing else.
std::string theoretical_memory_line(int64_t params, DType compute_dtype, int64_t shards,
                                    ShardedState sharded, int64_t activation_bytes,
                                    int64_t fp8_weights = 0, int64_t frozen = 0);
// Resident set size of this process now and its peak so far, in MB (MiB, as Megatron's "MB").
double resident_mb();
double max_resident_mb();

}  // namespace megatron
