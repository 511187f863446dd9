// T5's dataset hookup: Megatron's T5 span-corruption datasets over a `_text_sentence` indexed
// dataset (--data-path with --split, or the per-split paths) and the micro-batch of
// pretrain_t5.py's get_batch fields (models/t5/t5_chunk.h).
#pragma once

#include "data/data_config.h"
#include "data/tokenizer.h"
#include "models/model_spec.h"

namespace megatron {

Datasets t5_datasets(const DataConfig& config, const Tokenizer& tokenizer, int64_t seq_length,
                     const SampleCounts& counts, bool log);
BatchFn t5_batch_maker(const DataConfig& config, const Tokenizer& tokenizer);

}  // namespace megatron
