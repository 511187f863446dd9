// GPT's activation memory: the bytes one micro-batch leaves saved for backward in one model chunk,
// as our layers keep them (the start-up "Theoretical memory footprints" line's activation part).
#pragma once

#include <cstdint>

#include "transformer/config.h"

namespace megatron {

// Where a model chunk sits and how it is split, for the activation estimate.
struct ActivationShape {
  int64_t micro_batch_size = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int64_t num_layers = 0;   // layers of this chunk
  int64_t first_layer = 0;  // global number of its first layer (which are MoE layers)
  bool pre_process = true, post_process = true;
  int cp = 1;  // context parallelism: each rank holds s / cp of every sequence
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

}  // namespace megatron
