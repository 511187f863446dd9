// Memory accounting of a training rank: Megatron's start-up estimate of the weight and optimizer
// memory, and the measured resident memory of this process (Megatron reports the CUDA
// allocator's; on CPUs the resident set is what the machine sees).
//
// The estimate counts the bytes our buffers really take per parameter on this rank: fp32 main
// weights (4), the 16-bit compute copy in --bf16/--fp16 runs (2), fp32 gradients (4) and the two
// fp32 Adam moments (8, or 8/dp with the distributed optimizer, which keeps full fp32 main weights
// and gradients on every rank), i.e. 16 bytes in fp32 runs and 18 in mixed precision (Megatron's
// 18).
// It is not an activation model: activations depend on the schedule and recomputation; the
// measured peak is printed every --log-interval instead.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace megatron {

// Bytes of weights, gradients and optimizer state per parameter on one rank; the Adam moments are
// split over `moment_shards` ranks by the distributed optimizer (1 without it).
double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t moment_shards = 1);
// "Theoretical memory footprints: weight and optimizer=%.2f MB" for `params` parameters.
std::string theoretical_memory_line(int64_t params, DType compute_dtype, int64_t moment_shards = 1);
// Resident set size of this process now and its peak so far, in MB (MiB, as Megatron's "MB").
double resident_mb();
double max_resident_mb();

}  // namespace megatron
