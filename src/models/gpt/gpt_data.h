// GPT's dataset hookup: Megatron's GPT datasets over indexed datasets (--data-path with --split,
// or the per-split paths; blends), or mock documents for --mock-data; and the micro-batch of
// tokens, labels, loss mask, position ids and document starts (data/gpt_batch.h).
#pragma once

#include "data/data_config.h"
#include "data/tokenizer.h"
#include "models/model_spec.h"

namespace megatron {

// log: print the build lines (rank 0 only).
Datasets gpt_datasets(const DataConfig& config, const Tokenizer& tokenizer, int64_t seq_length,
                      const SampleCounts& counts, bool log);
BatchFn gpt_batch_maker(const DataConfig& config, const Tokenizer& tokenizer);

}  // namespace megatron
