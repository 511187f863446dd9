// Fp8Config: a run's FP8 training settings, Megatron's fp8_* TransformerConfig fields (set by
// --fp8-format and friends). Off by default. What they do is parallel/fp8_scaling.h's.
#pragma once

#include <cstdint>

#include "core/fp8.h"

namespace megatron {

enum class Fp8Mode : uint8_t {
  kOff,
  kE4M3,    // --fp8-format e4m3: every quantised tensor E4M3
  kHybrid,  // --fp8-format hybrid: E4M3 forward (inputs, weights), E5M2 gradients
};
enum class Fp8Recipe : uint8_t {
  kDelayed,     // --fp8-recipe delayed (default): scales from an amax history of earlier steps
  kTensorwise,  // --fp8-recipe tensorwise: each tensor's scale from its own amax (current scaling)
  kMxfp8,       // --fp8-recipe mxfp8: E8M0 scales per 32 elements along each GEMM's reduction
  kBlockwise,   // --fp8-recipe blockwise: power-of-two scales per 1 x 128 (activations,
                // gradients) or 128 x 128 (weights) block
};
// How a quantised operand is read by its GEMMs: with its blocks along its rows' elements (the
// forward's input and weight, the input gradient's output gradient) or down its columns (the
// input gradient's weight, both operands of the weight gradient). Per-tensor recipes quantise
// both alike.
enum class Fp8Usage : uint8_t { kRowwise, kColumnwise };

struct Fp8Config {
  Fp8Mode mode = Fp8Mode::kOff;             // --fp8-format (off when absent)
  Fp8Recipe recipe = Fp8Recipe::kDelayed;   // --fp8-recipe
  int margin = 0;                           // --fp8-margin: scales divided by 2^margin (delayed)
  int64_t amax_history_len = 1;             // --fp8-amax-history-len (delayed)
  bool amax_compute_max = false;            // --fp8-amax-compute-algo max (default most_recent)
  bool wgrad = true;                        // false with --no-fp8-wgrad: weight gradients in bf16
  bool first_last_layers_bf16 = false;      // --first-last-layers-bf16 (not with delayed)
  int64_t num_layers_at_start_in_bf16 = 1;  // --num-layers-at-start-in-bf16
  int64_t num_layers_at_end_in_bf16 = 1;    // --num-layers-at-end-in-bf16
  // --fp8-param-gather: the FP8 GEMMs' weights kept as FP8 codes, quantised by the distributed
  // optimizer after each step and all-gathered as such (Param::fp8).
  bool param_gather = false;

  bool enabled() const { return mode != Fp8Mode::kOff; }
  // mxfp8 and blockwise: scales per block of elements, no state between steps.
  bool block_scaled() const {
    return recipe == Fp8Recipe::kMxfp8 || recipe == Fp8Recipe::kBlockwise;
  }
  // The multiple TE pads an FP8 GEMM's rows to (Megatron's get_fp8_align_size): 32 for MXFP8's
  // 32-row column blocks, else 16.
  int64_t align_size() const { return recipe == Fp8Recipe::kMxfp8 ? 32 : 16; }
  Fp8Format forward_format() const { return Fp8Format::kE4M3; }
  Fp8Format backward_format() const {
    return mode == Fp8Mode::kHybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  }
  // Whether global layer `layer` (0-based) of `num_layers` runs its GEMMs in FP8 (Megatron's
  // is_first_last_bf16_layer, negated).
  bool layer_in_fp8(int64_t layer, int64_t num_layers) const {
    if (!enabled()) return false;
    if (!first_last_layers_bf16) return true;
    return layer >= num_layers_at_start_in_bf16 && layer < num_layers - num_layers_at_end_in_bf16;
  }
};

}  // namespace megatron
