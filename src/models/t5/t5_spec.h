// T5's spec (`megatron pretrain_t5`, --model t5): one T5Chunk, GPT's masked token loss, the T5
// batch fields and datasets (span corruption), the FLOPs of both stacks and the cross-attention,
// the activation estimate and the Hugging Face T5ForConditionalGeneration mapping.
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& t5_spec();

// Model FLOPs of one iteration, Megatron's counting (6 per multiply-add for forward and
// backward) over the encoder at --encoder-seq-length, the decoder at --decoder-seq-length with
// its cross-attention over the encoder's positions, and the logits of the decoder's positions.
double t5_flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size);

}  // namespace megatron
