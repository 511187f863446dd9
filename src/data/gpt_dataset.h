// GPTDataset: Megatron's GPT samples over an IndexedDataset, index for index the arrays of
// megatron/core/datasets/gpt_dataset.py and helpers.cpp, so that sample i here is sample i there.
//
// A split exposes documents [begin, end) (GPT counts sequences as documents). With T tokens in
// the split, seq_length s and N samples requested, the indices are:
//   epochs E          smallest E >= 1 with E * T >= N * s + 1 (each sample reads s + 1 tokens)
//   document index    [E * docs] int32: the split's ids repeated E times, shuffled by
//                     RandomState(seed); when E > 1 and the last epoch would supply fewer than
//                     80% of an epoch's samples, epochs 1..E-1 and the last one are shuffled
//                     separately ("separate final epoch") so a sliver of the last epoch is not
//                     spread over the whole run
//   sample index      [S + 1, 2] int32 (int64 past 2^31 entries): row j = (position in the
//                     document index, token offset) where sample j starts; S = (E*T - 1) / s.
//                     Consecutive samples share one token: sample j's last label is sample
//                     j+1's first input
//   shuffle index     [S] uint32 (int64 from 2^32 - 1): a RandomState permutation of the
//                     samples, the same stream continued; split in two like the documents
// and sample i is the s + 1 tokens starting at sample_index[shuffle[i]], across documents.
// Everything is cached as .npy files under the cache directory (see index_cache.h) and loaded
// from there when a complete, consistent cache exists.
//
// The index math takes sequence lengths as a span, so it is testable without files; GPTDataset is
// the thin file-backed wrapper. Not here: masks, position ids and loss masks (the trainer's), and
// dataset blending (blended_dataset.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "data/index_cache.h"
#include "data/numpy_random.h"
#include "data/sample_source.h"

namespace megatron {

class IndexedDataset;

// Megatron's Split enum; the names appear in cache file names and descriptions.
enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
const char* split_name(Split split);  // "train", "valid", "test"

// Book-ends (begin, end) of each split as fractions of the documents, or nullopt for a split of
// weight zero: "969,30,1" -> [(0, 0.969), (0.969, 0.999), (0.999, 1.0)].
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// Megatron's parse_and_normalize_split + convert_split_vector_to_split_matrix: the numbers in
// `split` (runs of digits and dots, so "969,30,1" and "969, 30, 1" are equal), missing ones 0,
// normalised to sum 1, accumulated left to right. Throws InvalidArgument naming --split.
SplitMatrix parse_split(const std::string& split);

struct DocumentRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Documents of each split: [round(b0 * n), round(b1 * n)) with Python's round (half to even).
std::array<std::optional<DocumentRange>, 3> split_document_ranges(const SplitMatrix& matrix,
                                                                  int64_t num_documents);
std::array<std::optional<DocumentRange>, 3> split_document_ranges(const std::string& split,
                                                                  int64_t num_documents);

// What a GPTDataset is built with: Megatron's GPTDatasetConfig, the fields that shape samples.
struct GPTDatasetConfig {
  int64_t random_seed = 1234;           // --seed; NumPy's RandomState needs it in [0, 2^32)
  int64_t sequence_length = 0;          // --seq-length (tokens per sample, labels excluded)
  std::optional<std::string> split;     // --split as given; nullopt with per-split data paths
  std::string tokenizer_json = "null";  // the tokenizer's identifiers (JSON) for the description
  std::string path_to_cache;  // --data-cache-path; "" = <data prefix>/cache/<class>_indices
  // Validation keeps its last partial sample (ceil instead of floor) when false. Megatron's
  // default, and pretrain_gpt.py's (it never sets it), is true.
  bool drop_last_partial_validation_sequence = true;
  int64_t pad_token_id = -1;  // fills a short sample (only when partial samples are kept)
  // Megatron's dataset class: it names the cache files, their default folder and the build lines
  // (GPTFIMDataset under --fim-data, whose indices are a GPTDataset's).
  std::string class_name = "GPTDataset";
  bool log = true;  // print Megatron's build/load lines (rank 0 only)
};

// Numbers fixed by the inputs before any shuffling: the shape of every index array.
struct GPTIndexPlan {
  int64_t tokens_per_epoch = 0;
  int64_t num_epochs = 0;
  int64_t num_samples = 0;  // rows of the sample index minus one
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // size of the first shuffle range when separate
  NpyDType sample_index_dtype = NpyDType::kInt32;
  NpyDType shuffle_index_dtype = NpyDType::kUInt32;
};

// Computes the plan; num_samples nullopt means one epoch (Megatron's num_samples=None).
// Throws InvalidArgument when the split has fewer than 2 tokens (no sample fits).
GPTIndexPlan plan_gpt_indices(std::span<const int32_t> sequence_lengths, DocumentRange documents,
                              std::optional<int64_t> num_samples, int64_t seq_length,
                              bool drop_last_partial_sequence);

struct GPTIndices {
  NpyArray document_index;  // [E * docs] int32: document ids in reading order
  NpyArray sample_index;    // [S + 1, 2] int32|int64: (document-index position, offset)
  NpyArray shuffle_index;   // [S] uint32|int64: sample i reads sample_index[shuffle[i]]
  GPTIndexPlan plan;
  bool from_cache = false;  // loaded from a cache rather than built
  int64_t num_samples() const { return plan.num_samples; }
};

// The three steps, in the order they draw from the one RandomState.
NpyArray build_document_index(DocumentRange documents, int64_t num_epochs,
                              bool separate_final_epoch, NumpyRandomState& rng);
NpyArray build_sample_index(std::span<const int32_t> sequence_lengths,
                            const NpyArray& document_index, const GPTIndexPlan& plan,
                            int64_t seq_length);
NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, NpyDType dtype,
                             NumpyRandomState& rng);

// Builds all three for the plan (no cache).
GPTIndices build_gpt_indices(std::span<const int32_t> sequence_lengths, DocumentRange documents,
                             const GPTIndexPlan& plan, int64_t seq_length, uint32_t seed);

// Empty when the arrays fit the plan and the documents (dtypes, shapes, value ranges, sample
// rows in order), else what does not: a cache that fails this is rebuilt, never trusted.
std::string check_gpt_indices(const GPTIndices& indices, std::span<const int32_t> sequence_lengths,
                              DocumentRange documents);

// Megatron's unique description of a GPTDataset: JSON (4-space indent, Python's json.dumps
// layout) of class, dataset_path, num_samples, index_split, random_seed, sequence_length, split,
// split_matrix, tokenizer. Its MD5 names the cache files.
std::string gpt_dataset_description(const std::string& dataset_path,
                                    std::optional<int64_t> num_samples, Split split,
                                    const GPTDatasetConfig& config);

// The cache directory Megatron uses for a dataset prefix when no --data-cache-path is given: the
// prefix itself used as a directory, `<prefix>/cache/<class_name>_indices`.
std::string default_gpt_cache_dir(const std::string& dataset_path,
                                  const std::string& class_name = "GPTDataset");

// Loads the indices from the cache in `cache_dir` if a complete, consistent one exists, else
// builds and saves them there (cache_dir "" = build only). Prints Megatron's lines when
// config.log.
GPTIndices load_or_build_gpt_indices(std::span<const int32_t> sequence_lengths,
                                     DocumentRange documents, std::optional<int64_t> num_samples,
                                     Split split, const std::string& dataset_path,
                                     const GPTDatasetConfig& config, const std::string& cache_dir);

// Reads `length` tokens of sequence `sequence` from token `offset` on, as int64.
using ReadTokens =
    std::function<void(int64_t sequence, int64_t offset, int64_t length, int64_t* out)>;

// Sample `index` (seq_length + 1 tokens) into out: Megatron's
// _query_document_sample_shuffle_indices, padded with pad_token_id when short.
void fetch_gpt_sample(const GPTIndices& indices, std::span<const int32_t> sequence_lengths,
                      int64_t seq_length, int64_t pad_token_id, int64_t index,
                      const ReadTokens& read, int64_t* out);

class GPTDataset : public SampleSource {
 public:
  // `documents` are this split's documents of `dataset` (see split_document_ranges);
  // num_samples nullopt = one epoch. Loads or builds the indices (see load_or_build_gpt_indices).
  GPTDataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
             std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config);

  int64_t size() const override { return indices_.num_samples(); }
  int64_t seq_length() const override { return seq_length_; }
  void sample(int64_t index, int64_t* out) const override;
  // The parts fetch_gpt_sample reads (empty documents contribute none).
  std::vector<int64_t> document_lengths(int64_t index) const override;

  Split split() const { return split_; }
  const GPTIndices& indices() const { return indices_; }
  // The JSON description (see gpt_dataset_description); BlendedDataset nests it in its own.
  const std::string& description() const { return description_; }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  Split split_;
  int64_t seq_length_, pad_token_id_;
  std::string description_;
  GPTIndices indices_;
};

}  // namespace megatron
