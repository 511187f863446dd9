// The conjugate communication pairs of tensor and sequence parallelism (Megatron's mappings.py).
//
// Each op is a pair of functions, <op>_forward and <op>_backward, "forward: X, backward: Y", where
// Y is the adjoint of X: the backward of a forward all-reduce is the identity, the backward of a
// split is an all-gather, and so on. There is no autograd: a layer calls the forward in its
// forward and the matching backward in its backward. Every op is a no-op on a size-1 group and
// then returns its argument itself (same storage), so TP=1 costs nothing.
//
// Layouts: activations are [s, b, h] (sequence first) or [rows, h]. "Last dim" ops split h into
// `size` equal chunks, rank r keeping columns [r*h/size, (r+1)*h/size). "Dim 0" ops split s (or
// rows) the same way; ProcessGroup's collectives move flat equal chunks in rank order, which on a
// contiguous tensor is exactly dim 0, while a last-dim gather needs an explicit re-interleaving
// copy (see gather_last_dim).
//
// Reductions (all-reduce, reduce-scatter) work in place on the tensor they are given when they
// can: `Tensor` is a handle, so the caller's tensor sees the sum. That is what a backward wants
// (the gradient is consumed) and matches torch.distributed.all_reduce; clone first if not.
#pragma once

#include <cstdint>
#include <string>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace megatron {

// numerator / denominator, checking divisibility; `what` names the quantities and the flags, e.g.
// "--ffn-hidden-size by --tensor-model-parallel-size". Megatron's core.utils.divide.
int64_t divide(int64_t numerator, int64_t denominator, const std::string& what);

// ---- building blocks (no autograd pairing)
// --------------------------------------------------------- x [..., h] -> this rank's columns [...,
// h/size] (a copy).
Tensor split_last_dim(const Tensor& x, ProcessGroup& group);
// x [..., h/size] on every rank -> [..., h], rank r's chunk in columns [r*h/size, (r+1)*h/size).
Tensor gather_last_dim(const Tensor& x, ProcessGroup& group);
// x [s, ...] -> this rank's rows [s/size, ...] (a copy).
Tensor split_dim0(const Tensor& x, ProcessGroup& group);
// x [s/size, ...] on every rank -> [s, ...] in rank order.
Tensor gather_dim0(const Tensor& x, ProcessGroup& group);
// x [s, ...] on every rank -> rows [r*s/size, (r+1)*s/size) of the sum over ranks.
Tensor reduce_scatter_dim0(const Tensor& x, ProcessGroup& group);
// x = sum over ranks of x, in place; returns x.
Tensor all_reduce_in_place(const Tensor& x, ProcessGroup& group);

// ---- tensor-parallel region -----------------------------------------------------------------
// copy_to_tp_region ("f"): forward identity, backward all-reduce. Enters a region where every rank
// computes a different partial function of the same input (ColumnParallelLinear's input), so the
// input's gradient is the sum of the ranks' partial gradients.
Tensor copy_to_tp_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor copy_to_tp_region_backward(const Tensor& dy, ProcessGroup& tp);

// reduce_from_tp_region ("g"): forward all-reduce, backward identity. Leaves the region: the output
// is the sum of the ranks' partial outputs (RowParallelLinear), each of which gets the full grad.
Tensor reduce_from_tp_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor reduce_from_tp_region_backward(const Tensor& dy, ProcessGroup& tp);

// scatter_to_tp_region: forward split last dim keeping this rank's chunk, backward all-gather
// last dim. Feeds a replicated activation to RowParallelLinear when input_is_parallel is false.
Tensor scatter_to_tp_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor scatter_to_tp_region_backward(const Tensor& dy, ProcessGroup& tp);

// gather_from_tp_region: forward all-gather last dim, backward split last dim. Makes
// ColumnParallelLinear's output whole (gather_output).
Tensor gather_from_tp_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor gather_from_tp_region_backward(const Tensor& dy, ProcessGroup& tp);

// ---- sequence-parallel region (dim 0) --------------------------------------------------------
// scatter_to_sequence_parallel_region: forward split dim 0, backward all-gather dim 0. Enters the
// sequence-parallel region from a replicated activation (the embedding output).
Tensor scatter_to_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor scatter_to_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp);

// gather_from_sequence_parallel_region: forward all-gather dim 0, backward reduce-scatter dim 0
// (the consumer is tensor parallel: each rank's gradient is a partial sum) or, with
// tp_output_grad false, split dim 0 (the consumer is replicated: each rank holds the full grad).
Tensor gather_from_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor gather_from_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp,
                                                     bool tp_output_grad = true);

// reduce_scatter_to_sequence_parallel_region: forward reduce-scatter dim 0, backward all-gather
// dim 0. Leaves the tensor-parallel region into the sequence-parallel one (RowParallelLinear's
// output under sequence parallelism): "g" with the all-reduce split into its two halves.
Tensor reduce_scatter_to_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp);
Tensor reduce_scatter_to_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp);

}  // namespace megatron
