// Builds the train/validation/test sample sources: mock sources for --mock-data, else GPT datasets
// through build_gpt_datasets with Megatron's per-split sample counts.
#include "train/datasets.h"

#include "core/error.h"
#include "core/logging.h"
#include "data/blended_dataset.h"
#include "data/mock_gpt_dataset.h"

#include <nlohmann/json.hpp>

namespace megatron {

SampleCounts sample_counts(const Arguments& a) {
  SampleCounts c;
  const int64_t gbs = a.global_batch_size;
  c.train = a.train_iters * gbs;
  c.valid = (a.train_iters / a.eval_interval + 1) * a.eval_iters * gbs;
  c.test = a.eval_iters * gbs;
  return c;
}

Datasets build_datasets(const Arguments& a, const Tokenizer& tokenizer, int64_t seq_length,
                        bool log) {
  const SampleCounts n = sample_counts(a);
  Datasets d;
  if (a.mock_data) {
    if (log) log_line("> building train, validation, and test datasets ...");
    // Each split gets its own document stream (seeds differ), like Megatron's mock splits.
    const uint64_t seed = static_cast<uint64_t>(a.seed);
    d.train = std::make_unique<MockGPTDataset>(n.train, seq_length, tokenizer.eod(), seed);
    if (n.valid > 0)
      d.valid = std::make_unique<MockGPTDataset>(n.valid, seq_length, tokenizer.eod(), seed + 1);
    if (n.test > 0)
      d.test = std::make_unique<MockGPTDataset>(n.test, seq_length, tokenizer.eod(), seed + 2);
    if (log)
      log_line(strprintf(" > mock GPT datasets: sequence length %ld, end-of-document id %ld",
                         static_cast<long>(seq_length), static_cast<long>(tokenizer.eod())));
    return d;
  }
  GPTDataArgs g;
  g.data_path = a.data_path;
  g.train_data_path = a.train_data_path;
  g.valid_data_path = a.valid_data_path;
  g.test_data_path = a.test_data_path;
  g.num_samples = {n.train, n.valid, n.test};
  g.config.random_seed = a.seed;
  g.config.sequence_length = seq_length;
  if (!a.data_path.empty()) g.config.split = a.split;
  g.config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  g.config.path_to_cache = a.data_cache_path;
  g.config.log = log;
  GPTDatasets built = build_gpt_datasets(g);
  MEGATRON_CHECK(built.train != nullptr,
                 "no training data: the training split of --data-path is "
                 "empty; check --split or --train-data-path");
  d.train = std::move(built.train);
  d.valid = std::move(built.valid);
  d.test = std::move(built.test);
  return d;
}

}  // namespace megatron
