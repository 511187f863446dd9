// Memory accounting of a training rank: Megatron's start-up estimate of the weight and optimizer
// memory, and the measured resident memory of this process (Megatron reports the CUDA
// allocator's; on CPUs the resident set is what the machine sees).
//
// The estimate counts the bytes our buffers really take per parameter on this rank: fp32 main
// weights (4), the 16-bit compute copy in --bf16/--fp16 runs (2), fp32 gradients (4) and the two
// fp32 Adam moments (8, or 8/dp with the distributed optimizer, which keeps full fp32 main weights
// and gradients on every rank), i.e. 16 bytes in fp32 runs and 18 in mixed precision (Megatron's
// 18).
// The activation estimate counts what our layers keep for backward per micro-batch (see
// activation_bytes_per_microbatch) times the micro-batches a stage holds at once under its
// pipeline schedule; the measured peak is printed once, after the first logging interval.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "transformer/config.h"

namespace megatron {

// Where a model chunk sits and how it is split, for the activation estimate.
struct ActivationShape {
  int64_t micro_batch_size = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int64_t num_layers = 0;  // layers of this chunk
  bool pre_process = true, post_process = true;
};

// Bytes one micro-batch leaves saved for backward in one model chunk, as our layers keep them:
// per layer its input and the residual x1 ([s', b, h], s' = s/tp under sequence parallelism), the
// norms' statistics, the inputs of the two column-parallel GEMMs ([s, b, h], gathered under
// sequence parallelism; 16-bit copies in --bf16/--fp16 runs), the packed QKV after RoPE, the core
// attention's output and log-sum-exp, the fc1 output and the fc2 input (all / tp); with
// recomputation only each recomputed segment's input; on the last chunk the final norm's input,
// the output GEMM's input, the fp32 logits [s b, Vp/tp] and their log-sum-exp; on the first the
// token and position ids. Dropout masks are never stored (regenerated from counters). Exact for
// a block in fp32 without tensor parallelism (tests/transformer/test_recompute.cpp).
int64_t activation_bytes_per_microbatch(const TransformerConfig& cfg, const ActivationShape& shape);

// Bytes of weights, gradients and optimizer state per parameter on one rank; the Adam moments are
// split over `moment_shards` ranks by the distributed optimizer (1 without it).
double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t moment_shards = 1);
// Megatron's "Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB,
// total=%.2f MB" for `params` parameters and `activation_bytes`.
std::string theoretical_memory_line(int64_t params, DType compute_dtype, int64_t moment_shards,
                                    int64_t activation_bytes);
// Resident set size of this process now and its peak so far, in MB (MiB, as Megatron's "MB").
double resident_mb();
double max_resident_mb();

}  // namespace megatron
