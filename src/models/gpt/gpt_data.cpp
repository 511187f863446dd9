// GPT datasets (mock or indexed, with Megatron's per-split sample counts) and GPT micro-batches.
#include "models/gpt/gpt_data.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/blended_dataset.h"
#include "data/fim_dataset.h"
#include "data/gpt_batch.h"
#include "data/mock_gpt_dataset.h"
#include "data/sft_dataset.h"

namespace megatron {

namespace {

// --fim-data: every split's samples permuted (data/fim_dataset.h), each split its own stream of
// per-sample seeds.
void with_fim(const DataConfig& a, const Tokenizer& tokenizer, Datasets* d) {
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
  MEGATRON_CHECK(hf != nullptr, "--fim-data needs --tokenizer-type HuggingFaceTokenizer");
  const FimTokens tokens = fim_tokens(a.fim, *hf);
  int64_t stream = 0;
  auto wrap = [&](std::unique_ptr<SampleSource>& source) {
    if (source)
      source =
          std::make_unique<FimSampleSource>(std::move(source), a.fim, tokens, *hf, a.seed, stream);
    ++stream;
  };
  wrap(d->train);
  wrap(d->valid);
  wrap(d->test);
  for (auto& more : d->more_valid) wrap(more);
}

}  // namespace

Datasets gpt_datasets(const DataConfig& a, const Tokenizer& tokenizer, int64_t seq_length,
                      const SampleCounts& n, bool log) {
  Datasets d;
  const PadToken pad = gpt_pad_token(tokenizer, a.allow_ambiguous_pad_tokens);
  if (log && pad.ambiguous)
    log_line("> warning: " + ambiguous_pad_warning(a.allow_ambiguous_pad_tokens));
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
  if (a.sft) {
    const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
    MEGATRON_CHECK(hf != nullptr, "--sft needs --tokenizer-type SFTTokenizer");
    return build_sft_datasets(a, *hf, seq_length, n, log);
  }
  GPTDataArgs g;
  g.data_path = a.data_path;
  g.train_data_path = a.train_data_path;
  g.valid_data_path = a.valid_data_path;
  g.test_data_path = a.test_data_path;
  g.num_samples = {n.train, n.valid, n.test};
  g.valid_one_epoch = n.valid_one_epoch;
  g.multiple_validation_sets = a.multiple_validation_sets;
  g.mid_level_dataset_surplus = a.mid_level_dataset_surplus;
  g.sequences_per_dataset_path = a.per_dataset_sequences_path;
  g.sequences_per_dataset = a.sequences_per_dataset;
  g.config.random_seed = a.seed;
  g.config.sequence_length = seq_length;
  if (!a.data_path.empty()) g.config.split = a.split;
  g.config.tokenizer_json = nlohmann::json(tokenizer.identity()).dump();
  g.config.path_to_cache = a.data_cache_path;
  g.config.pad_token_id = pad.id;
  g.config.log = log;
  if (a.fim_data) g.config.class_name = "GPTFIMDataset";
  GPTDatasets built = build_gpt_datasets(g);
  MEGATRON_CHECK(built.train != nullptr,
                 "no training data: the training split of --data-path is "
                 "empty; check --split or --train-data-path");
  d.train = std::move(built.train);
  d.valid = std::move(built.valid);
  d.test = std::move(built.test);
  d.more_valid = std::move(built.more_valid);
  if (a.fim_data) with_fim(a, tokenizer, &d);
  return d;
}

BatchFn gpt_batch_maker(const DataConfig& config, const Tokenizer& tokenizer) {
  if (config.sft) {  // the dataset's records carry Megatron's targets (data/sft_dataset.h)
    const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
    MEGATRON_CHECK(hf != nullptr, "--sft needs --tokenizer-type SFTTokenizer");
    const int64_t pad = SftTokenizer(*hf, config.sft_prompt_format).pad();
    return [pad](const SampleSource& data, int64_t first, int64_t b) {
      return gpt_batch_fields(make_sft_batch(data, first, b, pad));
    };
  }
  BatchOptions options;
  options.eod = tokenizer.eod();
  options.pad = gpt_pad_token(tokenizer, config.allow_ambiguous_pad_tokens).id;
  options.eod_mask_loss = config.eod_mask_loss;
  options.reset_position_ids = config.reset_position_ids;
  options.reset_attention_mask = config.reset_attention_mask;
  options.inter_document_masking = config.inter_document_masking;
  return [options](const SampleSource& data, int64_t first, int64_t b) {
    return gpt_batch_fields(make_batch(data, first, b, options));
  };
}

}  // namespace megatron
