// BERT's dataset hookup: Megatron's BERT datasets over a `_text_sentence` indexed dataset
// (--data-path with --split, or the per-split paths) and the micro-batch of pretrain_bert.py's
// get_batch fields (models/bert/bert_chunk.h).
#pragma once

#include "data/data_config.h"
#include "data/tokenizer.h"
#include "models/model_spec.h"

namespace megatron {

Datasets bert_datasets(const DataConfig& config, const Tokenizer& tokenizer, int64_t seq_length,
                       const SampleCounts& counts, bool log);
BatchFn bert_batch_maker(const DataConfig& config, const Tokenizer& tokenizer);

}  // namespace megatron
