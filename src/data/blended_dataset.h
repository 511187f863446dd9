// BlendedDataset: a weighted mixture of GPTDatasets, and build_gpt_datasets, which turns the data
// flags (--data-path, --train/valid/test-data-path, --split, sample counts) into the train,
// validation and test SampleSources, as Megatron's BlendedMegatronDatasetBuilder does.
//
// Blending (helpers.cpp's build_blending_indices) is deterministic, no RNG: with weights w
// normalised to sum 1 and c_i samples taken from dataset i so far, sample k comes from the
// dataset with the largest error w_i * max(k, 1) - c_i (ties to the lowest index) and is that
// dataset's sample c_i. Randomness within a dataset comes from its own shuffle index. A weighted
// blend asks each dataset for ceil(ceil(N * w_i) * (1 + surplus)) samples so the greedy order
// never runs one dry, and has sum_i ceil(N * w_i) samples itself.
//
// Not here: Megatron's exhaustive blending (no sizes), multiple validation sets, mock data
// (mock_gpt_dataset.h), and the rank-0-first build order (callers that run several ranks build
// on rank 0, barrier, then build elsewhere: the others then load the cache).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/index_cache.h"
#include "data/sample_source.h"

namespace megatron {

// numpy.sum of a float64 array: NumPy's pairwise summation, whose rounding the normalised
// weights (and so the blend order) depend on.
double numpy_sum(std::span<const double> values);
// Megatron's normalize(): w / numpy.sum(w).
std::vector<double> normalize_weights(std::span<const double> weights);

// helpers.cpp's build_blending_indices for normalised weights: dataset_index[k] (int16) and
// dataset_sample_index[k] (int64) for k in [0, size).
void build_blending_indices(std::span<const double> weights, std::span<int16_t> dataset_index,
                            std::span<int64_t> dataset_sample_index);
// helpers.cpp's build_exhaustive_blending_indices: every sample of every dataset once (sum of
// sizes entries), in the greedy order of the weights size / total, a dataset leaving the race
// once spent (a blend with no size: Megatron's size=None, --full-validation's one epoch).
void build_exhaustive_blending_indices(std::span<const int64_t> sizes,
                                       std::span<int16_t> dataset_index,
                                       std::span<int64_t> dataset_sample_index);

struct BlendedIndices {
  NpyArray dataset_index;         // [size] int16: which dataset sample k comes from
  NpyArray dataset_sample_index;  // [size] int64: which sample of that dataset
  bool from_cache = false;
};

// Megatron's BlendedDataset description: class, datasets (their descriptions, nested), split,
// weights (normalised), size; without a size (exhaustive) the weights are the datasets' sizes,
// written as integers, and the size null.
std::string blended_dataset_description(std::span<const std::string> dataset_descriptions,
                                        Split split, std::span<const double> weights,
                                        std::optional<int64_t> size);

// Normalises `weights`, then loads the indices from `cache_dir` if a complete, consistent cache
// exists there, else builds them and, when cache_dir is not empty, saves them. Throws
// InvalidArgument when the blend draws more samples from a dataset than it has (the fix is a
// larger --mid-level-dataset-surplus).
BlendedIndices load_or_build_blending_indices(std::span<const std::string> dataset_descriptions,
                                              std::span<const int64_t> dataset_sizes,
                                              std::span<const double> weights,
                                              std::optional<int64_t> size, Split split,
                                              const std::string& cache_dir, bool log);

class BlendedDataset : public SampleSource {
 public:
  // weights > 0, one per dataset, normalised here; the datasets share split and seq_length.
  // size nullopt: every sample of every dataset once (exhaustive; weights are then the sizes).
  // Cached only when path_to_cache is set, as Megatron does.
  BlendedDataset(std::vector<std::unique_ptr<GPTDataset>> datasets, std::vector<double> weights,
                 std::optional<int64_t> size, const std::string& path_to_cache, bool log);

  int64_t size() const override { return indices_.dataset_index.numel(); }
  int64_t seq_length() const override { return datasets_[0]->seq_length(); }
  void sample(int64_t index, int64_t* out) const override;
  std::vector<int64_t> document_lengths(int64_t index) const override;

  const std::vector<std::unique_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const BlendedIndices& indices() const { return indices_; }

 private:
  std::vector<std::unique_ptr<GPTDataset>> datasets_;
  BlendedIndices indices_;
};

// A --data-path style blend: "p" (one prefix), "w1 p1 w2 p2 ..." (weighted) or "p1 p2 ..."
// (weighted by dataset size: no weights); the arguments are further split on whitespace. `flag`
// names the flag in errors.
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};
Blend parse_blend(const std::vector<std::string>& args, const std::string& flag);

// The data flags of a GPT run.
struct GPTDataArgs {
  // --data-path: one prefix, "w1 p1 w2 p2 ..." (weighted blend) or "p1 p2 ..." (blend weighted
  // by dataset size); tokens are further split on whitespace. Splits by config.split.
  std::vector<std::string> data_path;
  // --train-data-path, --valid-data-path, --test-data-path: one blend per split, same syntax;
  // instead of data_path and --split.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  // Samples the run reads per split (train, valid, test); see megatron_split_num_samples.
  std::array<int64_t, 3> num_samples{};
  // --full-validation: the validation split is one epoch of its data (num_samples[1] unused;
  // Megatron's size None), blended exhaustively when it has several prefixes.
  bool valid_one_epoch = false;
  // --multiple-validation-sets: with several --valid-data-path prefixes, one validation dataset
  // per prefix (valid, then more_valid) instead of their blend.
  bool multiple_validation_sets = false;
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus
  // --per-dataset-sequences-path (its name, for messages, and its entries): each opened prefix
  // must have an entry equal to its .idx header's counts (sequences, documents + 1). Empty
  // name: no check.
  std::string sequences_per_dataset_path;
  std::map<std::string, std::pair<int64_t, int64_t>> sequences_per_dataset;
  // Seed, sequence length, --split (nullopt with data_path = Megatron's "969, 30, 1"), cache path.
  GPTDatasetConfig config;
};

// Megatron r0.14's requested sample counts: train = train_iters * gbs; valid = (train_iters //
// eval_interval + 1) * eval_iters * gbs; test = eval_iters * gbs (the trainer's, with core 0.19's
// evaluation flags, are train/datasets.h's sample_counts).
std::array<int64_t, 3> megatron_split_num_samples(int64_t train_iters, int64_t global_batch_size,
                                                  int64_t eval_interval, int64_t eval_iters);

struct GPTDatasets {
  // Null where the split is absent (zero --split weight, no per-split path, no documents, or no
  // samples requested).
  std::unique_ptr<SampleSource> train, valid, test;
  // --multiple-validation-sets: the validation datasets after the first (valid), in the order of
  // --valid-data-path.
  std::vector<std::unique_ptr<SampleSource>> more_valid;
};

// Opens the datasets and builds (or loads) every index. Throws InvalidArgument naming the flag
// for bad flags and for unreadable datasets.
GPTDatasets build_gpt_datasets(const GPTDataArgs& args);

}  // namespace megatron
