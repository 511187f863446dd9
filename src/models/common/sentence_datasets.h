// The train, validation and test sources of a model that reads sentence-level data (a
// `_text_sentence` dataset from `megatron preprocess --split-sentences`: BERT, T5), from the run's
// data flags: --data-path PREFIX with --split, or --train/valid/test-data-path, one prefix per
// split (blends of several prefixes are refused). --mock-data (GPT documents) is refused.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "data/data_config.h"
#include "data/gpt_dataset.h"  // DocumentRange, Split
#include "data/indexed_dataset.h"

namespace megatron {

// A split's source over `documents` of `data`, holding at least `count` samples; `split` is
// --split as given with --data-path (part of Megatron's dataset description), else nullopt.
using SentenceSourceFn = std::function<std::unique_ptr<SampleSource>(
    std::shared_ptr<const IndexedDataset> data, DocumentRange documents, int64_t count, Split which,
    const std::optional<std::string>& split)>;

// model: the name in messages ("BERT", "T5"); log: print Megatron's build lines.
Datasets sentence_datasets(const DataConfig& config, const SampleCounts& counts,
                           const std::string& model, const SentenceSourceFn& make, bool log);

}  // namespace megatron
