// An fp64 restatement of Transformer Engine's block-scaled FP8 (--fp8-recipe mxfp8 / blockwise)
// for tests, stated from what each rule promises rather than through core/fp8.h's
// fp8_block_scale: MXFP8 decodes a block with the smallest power of two that brings its amax
// within the format; blockwise scales it by the largest power of two not above max / amax (the
// f32 quotient). Values go through the codec (fp8_encode, fp8_decode).
#pragma once

#include <cstdint>

#include "core/fp8.h"
#include "tensor/tensor.h"

namespace megatron::testing {

// x [rows, cols] (any floating dtype, read as f32 values) quantised in blocks of br x bc (edge
// blocks partial), as the values times their block's decoding factor, f64.
Tensor block_quantised(const Tensor& x, int64_t br, int64_t bc, bool mxfp8, Fp8Format f);

}  // namespace megatron::testing
