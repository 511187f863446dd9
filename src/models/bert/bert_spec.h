// BERT's spec (`megatron pretrain_bert`, --model bert): BertChunk stages, BertLoss, the BERT batch
// fields, Megatron's FLOPs formula, the activation estimate and the Hugging Face mapping.
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& bert_spec();

}  // namespace megatron
