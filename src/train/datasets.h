// The train, validation and test sample sources of a run, with Megatron's sample counts:
// train = train_iters x global batch, validation = (train_iters / eval_interval + 1) x eval_iters x
// global batch, test = eval_iters x global batch. --mock-data builds mock sources; otherwise
// GPT datasets over indexed datasets (--data-path with --split, or the per-split paths).
#pragma once

#include <memory>

#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "train/arguments.h"

namespace megatron {

struct Datasets {
  std::unique_ptr<SampleSource> train, valid, test;  // valid/test null when absent
};

struct SampleCounts {
  int64_t train = 0, valid = 0, test = 0;
};
SampleCounts sample_counts(const Arguments& args);

// log: print the build lines (rank 0 only).
Datasets build_datasets(const Arguments& args, const Tokenizer& tokenizer, int64_t seq_length,
                        bool log = true);

}  // namespace megatron
