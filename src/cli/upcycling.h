// Megatron's --moe-use-upcycling (megatron/core/transformer/moe/upcycling_utils.py, "Upcycling
// Large Language Models into Mixture of Experts", arXiv 2410.07524): the dense model of the
// checkpoint in --load becomes this run's MoE model, written to --save as iteration 1 (weights
// only), which the run then loads and trains on.
//
// Every tensor the two models share by name is copied. Each MoE layer's experts come from the
// dense layer's MLP: with granularity g (--moe-upcycling-granularity; the dense FFN is g times an
// expert's) the dense fc1 rows (for a gated MLP the gate's and the up projection's rows each) and
// fc2 columns are cut into g pieces, expert e taking piece e mod g, all scaled by s^(1/3) for a
// gated or squared-ReLU MLP and s^(1/2) otherwise, where s (the MoE activation scale) is
// E g / topk with --moe-router-pre-softmax and g without. The router keeps this run's
// initialisation of its first E/g rows, each repeated g times (so the g pieces of one dense MLP
// share a routing score). Shared experts and the router's expert bias keep this run's
// initialisation. With g = 1 and softmax after the top-k, every token's probabilities sum to 1
// over identical experts, so the MoE model computes the dense one exactly.
//
// Megatron converts on every rank through its distributed checkpoints; here rank 0 converts the
// whole model in one process (both models in host memory) and every rank loads the result in
// its own layout.
#pragma once

#include "train/arguments.h"

namespace megatron::cli {

// Writes --save's iteration 1 from --load's dense checkpoint for the MoE model of `run`'s flags.
// Errors (InvalidArgument) name the flags: an existing checkpoint in --save, a dense model that
// does not match (layers, hidden size, heads, FFN width g times the experts').
void upcycle_checkpoint(const Arguments& run);

}  // namespace megatron::cli
