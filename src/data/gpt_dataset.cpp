// GPTDataset index construction and sample fetch: see the header.
#include "data/gpt_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "data/indexed_dataset.h"

namespace megatron {

namespace {

// Each sample reads one token more than seq_length so inputs and labels are both seq_length long
// (Megatron's add_extra_token_to_sequence, always on here: SampleSource hands out s + 1 tokens).
constexpr int64_t kExtra = 1;
// The final epoch is shuffled on its own when it supplies fewer than this share of an epoch.
constexpr double kSeparateFinalEpochThreshold = 0.80;

constexpr std::string_view kGPTSuffixes[] = {"document_index.npy", "sample_index.npy",
                                             "shuffle_index.npy"};

uint32_t checked_seed(int64_t seed) {
  MEGATRON_CHECK(seed >= 0 && seed <= 0xffffffffLL, "--seed ", seed,
                 " is outside [0, 2^32 - 1], the range NumPy's RandomState (which Megatron "
                 "shuffles its dataset indices with) accepts; pick a seed in that range");
  return static_cast<uint32_t>(seed);
}

int64_t tokens_in(std::span<const int32_t> lengths, DocumentRange docs) {
  int64_t total = 0;
  for (int64_t d = docs.begin; d < docs.end; ++d) total += lengths[static_cast<size_t>(d)];
  return total;
}

template <typename T>
void fill_sample_index(std::span<const int32_t> sizes, std::span<const int32_t> document_index,
                       int64_t num_samples, int64_t seq_length, std::span<T> out) {
  // helpers.cpp's build_sample_idx: walk the documents in document-index order, consuming
  // seq_length + 1 tokens per sample; a sample that ends inside a document records the offset
  // reached minus the extra token, so the next sample starts on this one's last token.
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  int64_t row = 0;
  int64_t position = 0;  // into document_index
  int64_t offset = 0;    // into that document
  out[0] = 0;
  out[1] = 0;
  ++row;
  while (row <= num_samples) {
    int64_t remaining = seq_length + kExtra;
    while (remaining != 0) {
      const int64_t doc = document_index[static_cast<size_t>(position)];
      const int64_t doc_length = sizes[static_cast<size_t>(doc)] - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += remaining + doc_length - kExtra;
        remaining = 0;
      } else {
        if (position == last) {
          // Only reached when the last partial sample is kept: it ends with the stream.
          MEGATRON_ASSERT(row == num_samples, "sample index ran out of documents at row ", row);
          offset = sizes[static_cast<size_t>(doc)] - kExtra;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    out[static_cast<size_t>(2 * row)] = static_cast<T>(position);
    out[static_cast<size_t>(2 * row + 1)] = static_cast<T>(offset);
    ++row;
  }
}

template <typename T>
void fill_arange_and_shuffle(std::span<T> out, int64_t start, NumpyRandomState& rng) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(start + static_cast<int64_t>(i));
  rng.shuffle(out);
}

template <typename T>
void fill_shuffle_index(NpyArray& a, int64_t num_samples, NumpyRandomState& rng) {
  std::span<T> all = a.mutable_values<T>();
  fill_arange_and_shuffle(all.first(static_cast<size_t>(num_samples)), 0, rng);
  if (static_cast<size_t>(num_samples) != all.size()) {
    fill_arange_and_shuffle(all.subspan(static_cast<size_t>(num_samples)), num_samples, rng);
  }
}

}  // namespace

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "?";
}

SplitMatrix parse_split(const std::string& split) {
  // re.findall(r"[.0-9]+", split), each run read as a Python float.
  std::vector<double> weights;
  for (size_t i = 0; i < split.size();) {
    if (!(std::isdigit(static_cast<unsigned char>(split[i])) || split[i] == '.')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() &&
           (std::isdigit(static_cast<unsigned char>(split[j])) || split[j] == '.')) {
      ++j;
    }
    const std::string run = split.substr(i, j - i);
    char* stop = nullptr;
    const double w = std::strtod(run.c_str(), &stop);
    MEGATRON_CHECK(stop && *stop == '\0' && run != ".", "--split \"", split, "\": \"", run,
                   "\" is not a number; expected up to three weights like \"969,30,1\"");
    weights.push_back(w);
    i = j;
  }
  MEGATRON_CHECK(weights.size() <= 3, "--split \"", split, "\" has ", weights.size(),
                 " weights; expected at most three (train, validation, test), e.g. \"969,30,1\"");
  weights.resize(3, 0.0);
  const double sum = weights[0] + weights[1] + weights[2];
  MEGATRON_CHECK(sum > 0 && std::isfinite(sum), "--split \"", split,
                 "\" has no positive weight; give the train split one, e.g. \"969,30,1\"");
  for (double& w : weights) w /= sum;
  // Cumulative book-ends; a split whose end does not pass its begin is absent.
  SplitMatrix matrix;
  double begin = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double end = begin + weights[i];
    if (end > begin) matrix[i] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::array<std::optional<DocumentRange>, 3> split_document_ranges(const SplitMatrix& matrix,
                                                                  int64_t num_documents) {
  std::array<std::optional<DocumentRange>, 3> ranges;
  const double n = static_cast<double>(num_documents);
  for (size_t i = 0; i < 3; ++i) {
    if (!matrix[i]) continue;
    // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
    ranges[i] = DocumentRange{static_cast<int64_t>(std::nearbyint(matrix[i]->first * n)),
                              static_cast<int64_t>(std::nearbyint(matrix[i]->second * n))};
  }
  return ranges;
}

std::array<std::optional<DocumentRange>, 3> split_document_ranges(const std::string& split,
                                                                  int64_t num_documents) {
  return split_document_ranges(parse_split(split), num_documents);
}

GPTIndexPlan plan_gpt_indices(std::span<const int32_t> sequence_lengths, DocumentRange documents,
                              std::optional<int64_t> num_samples, int64_t seq_length,
                              bool drop_last_partial_sequence) {
  MEGATRON_CHECK(seq_length >= 1, "--seq-length must be at least 1, got ", seq_length);
  MEGATRON_ASSERT(documents.begin >= 0 && documents.begin <= documents.end &&
                      documents.end <= static_cast<int64_t>(sequence_lengths.size()),
                  "document range [", documents.begin, ", ", documents.end, ") outside [0, ",
                  sequence_lengths.size(), ")");
  MEGATRON_CHECK(!num_samples || *num_samples >= 0,
                 "negative number of samples requested: ", *num_samples);
  GPTIndexPlan plan;
  const int64_t t = tokens_in(sequence_lengths, documents);
  plan.tokens_per_epoch = t;
  MEGATRON_CHECK(t > kExtra, "documents [", documents.begin, ", ", documents.end, ") hold ", t,
                 " tokens; a sample needs at least ", kExtra + 1,
                 ". Give this split more data (--split, or a larger --data-path dataset)");

  plan.num_epochs = 1;
  if (num_samples) {
    const int64_t requested = *num_samples * seq_length + kExtra;
    plan.num_epochs = std::max<int64_t>(1, (requested + t - 1) / t);
  }
  const int64_t e = plan.num_epochs;
  if (e > 1) {
    plan.num_samples_sans_final_epoch = ((e - 1) * t - kExtra) / seq_length;
    const int64_t from_final_epoch = *num_samples - plan.num_samples_sans_final_epoch;
    const int64_t per_epoch = (t - kExtra) / seq_length;
    MEGATRON_ASSERT(from_final_epoch >= 0 && from_final_epoch <= per_epoch + 1,
                    "final epoch supplies ", from_final_epoch, " of ", per_epoch, " samples");
    plan.separate_final_epoch =
        from_final_epoch <
        static_cast<int64_t>(kSeparateFinalEpochThreshold * static_cast<double>(per_epoch));
  }
  if (drop_last_partial_sequence) {
    plan.num_samples = (e * t - kExtra) / seq_length;
  } else {
    // helpers.cpp divides in single precision here; so do we, to get its count.
    plan.num_samples = static_cast<int64_t>(
        std::ceil(static_cast<float>(e * t - kExtra) / static_cast<float>(seq_length)));
  }
  const int64_t doc_index_size = e * documents.size();
  plan.sample_index_dtype =
      doc_index_size <= std::numeric_limits<int32_t>::max() ? NpyDType::kInt32 : NpyDType::kInt64;
  plan.shuffle_index_dtype =
      plan.num_samples >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1
          ? NpyDType::kInt64
          : NpyDType::kUInt32;
  return plan;
}

NpyArray build_document_index(DocumentRange documents, int64_t num_epochs,
                              bool separate_final_epoch, NumpyRandomState& rng) {
  if (!separate_final_epoch || num_epochs == 1) {
    const int64_t n = documents.size();
    NpyArray a(NpyDType::kInt32, {num_epochs * n});
    std::span<int32_t> v = a.mutable_values<int32_t>();
    for (int64_t epoch = 0; epoch < num_epochs; ++epoch) {
      for (int64_t d = 0; d < n; ++d) {
        v[static_cast<size_t>(epoch * n + d)] = static_cast<int32_t>(documents.begin + d);
      }
    }
    rng.shuffle(v);
    return a;
  }
  const NpyArray first = build_document_index(documents, num_epochs - 1, false, rng);
  const NpyArray last = build_document_index(documents, 1, false, rng);
  NpyArray a(NpyDType::kInt32, {first.numel() + last.numel()});
  std::span<int32_t> v = a.mutable_values<int32_t>();
  std::ranges::copy(first.values<int32_t>(), v.begin());
  std::ranges::copy(last.values<int32_t>(), v.begin() + first.numel());
  return a;
}

NpyArray build_sample_index(std::span<const int32_t> sequence_lengths,
                            const NpyArray& document_index, const GPTIndexPlan& plan,
                            int64_t seq_length) {
  NpyArray a(plan.sample_index_dtype, {plan.num_samples + 1, 2});
  if (plan.sample_index_dtype == NpyDType::kInt32) {
    fill_sample_index(sequence_lengths, document_index.values<int32_t>(), plan.num_samples,
                      seq_length, a.mutable_values<int32_t>());
  } else {
    fill_sample_index(sequence_lengths, document_index.values<int32_t>(), plan.num_samples,
                      seq_length, a.mutable_values<int64_t>());
  }
  return a;
}

NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, NpyDType dtype,
                             NumpyRandomState& rng) {
  MEGATRON_ASSERT(0 <= num_samples && num_samples <= total_size, "shuffle ranges");
  NpyArray a(dtype, {total_size});
  if (dtype == NpyDType::kUInt32) {
    fill_shuffle_index<uint32_t>(a, num_samples, rng);
  } else {
    MEGATRON_ASSERT(dtype == NpyDType::kInt64, "shuffle index is uint32 or int64");
    fill_shuffle_index<int64_t>(a, num_samples, rng);
  }
  return a;
}

GPTIndices build_gpt_indices(std::span<const int32_t> sequence_lengths, DocumentRange documents,
                             const GPTIndexPlan& plan, int64_t seq_length, uint32_t seed) {
  NumpyRandomState rng(seed);
  GPTIndices out;
  out.plan = plan;
  out.document_index =
      build_document_index(documents, plan.num_epochs, plan.separate_final_epoch, rng);
  out.sample_index = build_sample_index(sequence_lengths, out.document_index, plan, seq_length);
  const int64_t first_range =
      plan.separate_final_epoch ? plan.num_samples_sans_final_epoch : plan.num_samples;
  out.shuffle_index =
      build_shuffle_index(first_range, plan.num_samples, plan.shuffle_index_dtype, rng);
  return out;
}

std::string check_gpt_indices(const GPTIndices& indices, std::span<const int32_t> sequence_lengths,
                              DocumentRange documents) {
  const GPTIndexPlan& plan = indices.plan;
  auto shape_text = [](const NpyArray& a) {
    std::string s = std::string(npy_dtype_name(a.dtype())) + "[";
    for (size_t i = 0; i < a.shape().size(); ++i)
      s += (i ? ", " : "") + std::to_string(a.shape()[i]);
    return s + "]";
  };
  const NpyArray& doc = indices.document_index;
  const int64_t n_doc = plan.num_epochs * documents.size();
  if (doc.dtype() != NpyDType::kInt32 || doc.shape() != std::vector<int64_t>{n_doc}) {
    return "document index is " + shape_text(doc) + ", expected int32[" + std::to_string(n_doc) +
           "]";
  }
  for (int32_t d : doc.values<int32_t>()) {
    if (d < documents.begin || d >= documents.end) {
      return "document index holds document " + std::to_string(d) + " outside [" +
             std::to_string(documents.begin) + ", " + std::to_string(documents.end) + ")";
    }
  }
  const NpyArray& si = indices.sample_index;
  if (si.dtype() != plan.sample_index_dtype ||
      si.shape() != std::vector<int64_t>{plan.num_samples + 1, 2}) {
    return "sample index is " + shape_text(si) + ", expected " +
           npy_dtype_name(plan.sample_index_dtype) + "[" + std::to_string(plan.num_samples + 1) +
           ", 2]";
  }
  int64_t prev_pos = 0, prev_off = 0;
  for (int64_t r = 0; r <= plan.num_samples; ++r) {
    const int64_t pos = si.get(2 * r), off = si.get(2 * r + 1);
    if (pos < 0 || pos >= n_doc) return "sample index row " + std::to_string(r) + " is corrupt";
    const int64_t len = sequence_lengths[static_cast<size_t>(doc.get(pos))];
    const bool ordered = pos > prev_pos || (pos == prev_pos && off >= prev_off);
    // Offsets stay below the document's length; the one exception is a kept partial last
    // sample ending on an empty document, where helpers.cpp records offset length - 1 = -1.
    const bool end_on_empty = r == plan.num_samples && len == 0 && off == -1;
    const bool in_document = (off >= 0 && off <= std::max<int64_t>(len - 1, 0)) || end_on_empty;
    if (!in_document || !ordered || (r == 0 && off != 0)) {
      return "sample index row " + std::to_string(r) + " is corrupt";
    }
    prev_pos = pos;
    prev_off = off;
  }
  const NpyArray& sh = indices.shuffle_index;
  if (sh.dtype() != plan.shuffle_index_dtype ||
      sh.shape() != std::vector<int64_t>{plan.num_samples}) {
    return "shuffle index is " + shape_text(sh) + ", expected " +
           npy_dtype_name(plan.shuffle_index_dtype) + "[" + std::to_string(plan.num_samples) + "]";
  }
  for (int64_t i = 0; i < sh.numel(); ++i) {
    const int64_t v = sh.get(i);
    if (v < 0 || v >= plan.num_samples) {
      return "shuffle index entry " + std::to_string(i) + " is out of range";
    }
  }
  return "";
}

std::string gpt_dataset_description(const std::string& dataset_path,
                                    std::optional<int64_t> num_samples, Split split,
                                    const GPTDatasetConfig& config) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["class"] = config.class_name;
  j["dataset_path"] = dataset_path;
  j["num_samples"] = num_samples ? Json(*num_samples) : Json(nullptr);
  j["index_split"] = split_name(split);
  j["random_seed"] = config.random_seed;
  j["sequence_length"] = config.sequence_length;
  if (config.split) {
    j["split"] = *config.split;
    Json matrix = Json::array();
    const SplitMatrix m = parse_split(*config.split);
    for (size_t i = 0; i < 3; ++i) {
      if (!m[i]) {
        matrix.push_back(nullptr);
      } else if (i == 0) {
        // Megatron accumulates from the integer 0, so the first book-end prints as 0, not 0.0.
        matrix.push_back(Json::array({0, m[i]->second}));
      } else {
        matrix.push_back(Json::array({m[i]->first, m[i]->second}));
      }
    }
    j["split_matrix"] = matrix;
  } else {
    j["split"] = nullptr;
    j["split_matrix"] = nullptr;
  }
  Json tokenizer;
  try {
    tokenizer = Json::parse(config.tokenizer_json);
  } catch (const Json::exception& e) {
    MEGATRON_ASSERT(false, "tokenizer identifiers are not JSON: ", e.what());
  }
  j["tokenizer"] = tokenizer;
  // Python's json.dumps(indent=4) escapes non-ASCII; so does ensure_ascii here.
  return j.dump(4, ' ', true);
}

std::string default_gpt_cache_dir(const std::string& dataset_path, const std::string& class_name) {
  return (std::filesystem::path(dataset_path) / "cache" / (class_name + "_indices")).string();
}

namespace {
// A structurally valid cache can still be stale: the dataset was preprocessed again under the same
// prefix with the same document count. The sample index is a pure function of the document index
// and the current sequence lengths, so recompute it (O(samples)) and require equality; and the
// shuffle index must be a permutation.
std::string check_against_data(const GPTIndices& loaded, std::span<const int32_t> sequence_lengths,
                               int64_t seq_length) {
  const NpyArray expected =
      build_sample_index(sequence_lengths, loaded.document_index, loaded.plan, seq_length);
  if (expected.nbytes() != loaded.sample_index.nbytes() ||
      std::memcmp(expected.data(), loaded.sample_index.data(), expected.nbytes()) != 0) {
    return "sample index does not match the dataset's current sequence lengths (stale cache)";
  }
  std::vector<bool> seen(static_cast<size_t>(loaded.shuffle_index.numel()), false);
  for (int64_t i = 0; i < loaded.shuffle_index.numel(); ++i) {
    const int64_t v = loaded.shuffle_index.get(i);
    if (seen[static_cast<size_t>(v)]) {
      return "shuffle index repeats sample " + std::to_string(v);
    }
    seen[static_cast<size_t>(v)] = true;
  }
  return "";
}
}  // namespace

GPTIndices load_or_build_gpt_indices(std::span<const int32_t> sequence_lengths,
                                     DocumentRange documents, std::optional<int64_t> num_samples,
                                     Split split, const std::string& dataset_path,
                                     const GPTDatasetConfig& config, const std::string& cache_dir) {
  const uint32_t seed = checked_seed(config.random_seed);
  const bool drop_last = split != Split::kValid || config.drop_last_partial_validation_sequence;
  const GPTIndexPlan plan =
      plan_gpt_indices(sequence_lengths, documents, num_samples, config.sequence_length, drop_last);
  const std::string name = split_name(split);
  auto log = [&](const std::string& line) {
    if (config.log) log_line(line);
  };

  std::optional<IndexCache> cache;
  if (!cache_dir.empty()) {
    cache.emplace(cache_dir, config.class_name, name,
                  gpt_dataset_description(dataset_path, num_samples, split, config));
    std::string why;
    if (auto arrays = cache->load(kGPTSuffixes, &why)) {
      GPTIndices loaded;
      loaded.document_index = std::move((*arrays)[0]);
      loaded.sample_index = std::move((*arrays)[1]);
      loaded.shuffle_index = std::move((*arrays)[2]);
      loaded.plan = plan;
      loaded.from_cache = true;
      why = check_gpt_indices(loaded, sequence_lengths, documents);
      if (why.empty()) why = check_against_data(loaded, sequence_lengths, config.sequence_length);
      if (why.empty()) {
        log("Load the " + config.class_name + " " + name + " indices");
        for (std::string_view suffix : kGPTSuffixes) {
          std::string what(suffix.substr(0, suffix.size() - 4));  // "document_index"
          std::replace(what.begin(), what.end(), '_', ' ');
          log("\tLoad the " + what + " from " +
              std::filesystem::path(cache->path(suffix)).filename().string());
        }
        log("> total number of samples: " + std::to_string(plan.num_samples));
        return loaded;
      }
    }
    bool any_file = false;
    for (std::string_view suffix :
         {std::string_view("description.txt"), kGPTSuffixes[0], kGPTSuffixes[1], kGPTSuffixes[2]}) {
      any_file = any_file || std::filesystem::exists(cache->path(suffix));
    }
    if (any_file)
      log("> rebuilding the cached " + config.class_name + " " + name + " indices: " + why);
  }

  log("Build and save the " + config.class_name + " " + name + " indices");
  GPTIndices built =
      build_gpt_indices(sequence_lengths, documents, plan, config.sequence_length, seed);
  if (cache) {
    const NpyArray* arrays[] = {&built.document_index, &built.sample_index, &built.shuffle_index};
    cache->save(kGPTSuffixes, arrays);
  } else {
    log("> WARNING: unable to save the " + config.class_name +
        " indexes because no cache path is set");
  }
  log("> total number of samples: " + std::to_string(plan.num_samples));
  log("> total number of epochs: " + std::to_string(plan.num_epochs));
  return built;
}

void fetch_gpt_sample(const GPTIndices& indices, std::span<const int32_t> sequence_lengths,
                      int64_t seq_length, int64_t pad_token_id, int64_t index,
                      const ReadTokens& read, int64_t* out) {
  MEGATRON_CHECK(index >= 0 && index < indices.num_samples(), "sample ", index,
                 " is outside the dataset's [0, ", indices.num_samples(), ")");
  const NpyArray& si = indices.sample_index;
  const NpyArray& doc = indices.document_index;
  const int64_t j = indices.shuffle_index.get(index);
  const int64_t d0 = si.get(2 * j), o0 = si.get(2 * j + 1);
  const int64_t d1 = si.get(2 * j + 2), o1 = si.get(2 * j + 3);
  const int64_t capacity = seq_length + kExtra;
  int64_t n = 0;
  auto take = [&](int64_t position, int64_t offset, int64_t length) {
    const int64_t sequence = doc.get(position);
    MEGATRON_ASSERT(length >= 0 && n + length <= capacity &&
                        offset + length <= sequence_lengths[static_cast<size_t>(sequence)],
                    "sample ", index, " reads past its document or its buffer");
    if (length > 0) read(sequence, offset, length, out + n);
    n += length;
  };
  if (d0 == d1) {
    take(d0, o0, o1 - o0 + kExtra);
  } else {
    for (int64_t p = d0; p <= d1; ++p) {
      const int64_t offset = p > d0 ? 0 : o0;
      const int64_t length =
          p < d1 ? sequence_lengths[static_cast<size_t>(doc.get(p))] - offset : o1 + kExtra;
      take(p, offset, length);
    }
  }
  std::fill(out + n, out + capacity, pad_token_id);
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> dataset, DocumentRange documents,
                       std::optional<int64_t> num_samples, Split split,
                       const GPTDatasetConfig& config)
    : dataset_(std::move(dataset)),
      split_(split),
      seq_length_(config.sequence_length),
      pad_token_id_(config.pad_token_id) {
  MEGATRON_ASSERT(dataset_ != nullptr, "GPTDataset needs a dataset");
  MEGATRON_CHECK(documents.begin >= 0 && documents.begin <= documents.end &&
                     documents.end <= dataset_->num_sequences(),
                 "documents [", documents.begin, ", ", documents.end, ") are outside ",
                 dataset_->prefix(), "'s ", dataset_->num_sequences(), " sequences");
  const std::string& path = dataset_->prefix();
  const std::string cache_dir = config.path_to_cache.empty()
                                    ? default_gpt_cache_dir(path, config.class_name)
                                    : config.path_to_cache;
  description_ = gpt_dataset_description(path, num_samples, split, config);
  indices_ = load_or_build_gpt_indices(dataset_->sequence_lengths(), documents, num_samples, split,
                                       path, config, cache_dir);
}

void GPTDataset::sample(int64_t index, int64_t* out) const {
  fetch_gpt_sample(
      indices_, dataset_->sequence_lengths(), seq_length_, pad_token_id_, index,
      [this](int64_t sequence, int64_t offset, int64_t length, int64_t* dst) {
        dataset_->read(sequence, offset, length, dst);
      },
      out);
}

std::vector<int64_t> GPTDataset::document_lengths(int64_t index) const {
  std::vector<int64_t> lengths;
  std::vector<int64_t> unused(static_cast<size_t>(seq_length_ + kExtra));
  fetch_gpt_sample(
      indices_, dataset_->sequence_lengths(), seq_length_, pad_token_id_, index,
      [&](int64_t, int64_t, int64_t length, int64_t*) { lengths.push_back(length); },
      unused.data());
  return lengths;
}

}  // namespace megatron
