// Dropout over this rank's rows of an [s, b, ...] activation with the masks the single-process
// run draws: element (t, i, j) of the full activation has counter (t b + i) h + j in every
// layout. A rank's rows are global rows through the sequence-parallel part (rows [k n, (k + 1) n)
// of the local sequence on TP rank k) and the context-parallel chunks (ContextParallelContext::
// global_row); consecutive global rows are one ops::dropout call at their offset.
#pragma once

#include "transformer/tensor_parallel_context.h"

namespace megatron {

// x: [rows, b, ...] (any shape whose first dim is the sequence); out may be x. sp_split: x is
// this TP rank's sequence-parallel part of the local sequence (else the whole local sequence).
void sequence_dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                              const TensorParallelContext& tp, bool sp_split);
void sequence_dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed,
                               uint64_t stream, const TensorParallelContext& tp, bool sp_split);

}  // namespace megatron
