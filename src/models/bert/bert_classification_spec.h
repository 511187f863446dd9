// The BERT sequence classifier's spec (`megatron finetune --task`, --model bert_classification):
// Megatron's Classification model (BERT + pooler + dropout + classification_head) trained with
// the cross entropy of tasks/finetune_utils.py on GLUE-style TSV or JSON-lines data
// (data/classification_dataset.h), with validation accuracy at every evaluation.
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& bert_classification_spec();

}  // namespace megatron
