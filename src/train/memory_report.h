// Memory accounting of a training rank: Megatron's start-up estimate of the weight and optimizer
// memory, and the measured resident memory of this process (Megatron reports the CUDA
// allocator's; on CPUs the resident set is what the machine sees).
//
// The estimate counts the bytes our buffers really take per parameter on this rank
// (plan/memory_model.h, the planner's rule).
// The activation estimate (each model's, e.g. models/gpt/gpt_memory.h) counts what its layers
// keep for backward per micro-batch times the micro-batches a stage holds at once under its
// pipeline schedule; the measured peak is printed once, after the first logging interval.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "plan/memory_model.h"

namespace megatron {

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
