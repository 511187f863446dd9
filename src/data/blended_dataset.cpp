// Dataset blending and the GPT dataset builder: see the header.
#include "data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/logging.h"
#include "data/indexed_dataset.h"

namespace megatron {

namespace {

constexpr std::string_view kBlendedSuffixes[] = {"dataset_index.npy", "dataset_sample_index.npy"};
// Megatron's --split when --data-path is given without one (arguments.py's legacy default, spaces
// included: the string goes into the cache description).
constexpr const char* kLegacyDefaultSplit = "969, 30, 1";
// NumPy's pairwise summation block (PW_BLOCKSIZE).
constexpr size_t kPairwiseBlock = 128;

// Empty when the arrays are a well-formed blend of `size` samples over the datasets, else why.
std::string check_blending_indices(const BlendedIndices& b, size_t num_datasets, int64_t size) {
  if (b.dataset_index.dtype() != NpyDType::kInt16 ||
      b.dataset_index.shape() != std::vector<int64_t>{size} ||
      b.dataset_sample_index.dtype() != NpyDType::kInt64 ||
      b.dataset_sample_index.shape() != std::vector<int64_t>{size}) {
    return "arrays are not int16[" + std::to_string(size) + "] and int64[" + std::to_string(size) +
           "]";
  }
  // Each dataset's samples are taken in order, so entry k must be that dataset's running count.
  std::vector<int64_t> counts(num_datasets, 0);
  const auto di = b.dataset_index.values<int16_t>();
  const auto dsi = b.dataset_sample_index.values<int64_t>();
  for (size_t k = 0; k < di.size(); ++k) {
    if (di[k] < 0 || static_cast<size_t>(di[k]) >= num_datasets ||
        dsi[k] != counts[static_cast<size_t>(di[k])]++) {
      return "entry " + std::to_string(k) + " is corrupt";
    }
  }
  return "";
}

}  // namespace

// Megatron's get_blend_from_list over whitespace-separated tokens.
Blend parse_blend(const std::vector<std::string>& args, const std::string& flag) {
  std::vector<std::string> tokens;
  for (const std::string& a : args) {
    std::istringstream in(a);
    for (std::string t; in >> t;) tokens.push_back(t);
  }
  Blend blend;
  if (tokens.empty()) return blend;
  if (tokens.size() % 2 == 1) {
    blend.prefixes = tokens;
    return blend;
  }
  std::vector<double> weights;
  size_t parsed = 0;
  for (size_t i = 0; i < tokens.size(); i += 2) {
    char* stop = nullptr;
    const double w = std::strtod(tokens[i].c_str(), &stop);
    if (stop != tokens[i].c_str() && *stop == '\0') {
      ++parsed;
      weights.push_back(w);
    }
  }
  if (parsed == 0) {
    blend.prefixes = tokens;
    return blend;
  }
  MEGATRON_CHECK(parsed == tokens.size() / 2, flag,
                 ": some weights are not numbers; expected \"prefix\", \"w1 prefix1 w2 prefix2 "
                 "...\" or \"prefix1 prefix2 ...\"");
  for (size_t i = 0; i < weights.size(); ++i) {
    MEGATRON_CHECK(std::isfinite(weights[i]) && weights[i] > 0, flag, ": the weight of ",
                   tokens[2 * i + 1], " is ", tokens[2 * i], "; weights must be positive numbers");
    blend.prefixes.push_back(tokens[2 * i + 1]);
  }
  blend.weights = std::move(weights);
  return blend;
}

namespace {

int64_t tokens_in(const IndexedDataset& d, DocumentRange r) {
  int64_t total = 0;
  for (int64_t i = r.begin; i < r.end; ++i) total += d.sequence_lengths()[static_cast<size_t>(i)];
  return total;
}

std::string range_text(DocumentRange r) {
  return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
}

// One open --data-path prefix and the documents of each split in it.
struct Source {
  std::string prefix;
  std::shared_ptr<const IndexedDataset> dataset;
  std::array<std::optional<DocumentRange>, 3> ranges;
};

Source open_source(const std::string& prefix, const SplitMatrix& matrix, bool log,
                   const GPTDataArgs& args) {
  Source s;
  s.prefix = prefix;
  s.dataset = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  const int64_t n = s.dataset->num_sequences();
  if (!args.sequences_per_dataset_path.empty()) {
    // Megatron reads the counts from the file instead of the .idx header (a stale file misreads
    // the index there); here they must agree.
    const auto it = args.sequences_per_dataset.find(prefix);
    MEGATRON_CHECK(it != args.sequences_per_dataset.end(), "--per-dataset-sequences-path '",
                   args.sequences_per_dataset_path, "' has no entry for the dataset prefix '",
                   prefix, "': rebuild it for this blend");
    const std::pair<int64_t, int64_t> header{n, s.dataset->num_documents() + 1};
    MEGATRON_CHECK(it->second == header, "--per-dataset-sequences-path '",
                   args.sequences_per_dataset_path, "' gives ", prefix, " [", it->second.first,
                   ", ", it->second.second, "] but its .idx holds [", header.first, ", ",
                   header.second, "] (sequences, documents + 1): the file is stale; rebuild it");
  }
  s.ranges = split_document_ranges(matrix, n);
  if (log) {
    std::string line = " > " + prefix + ": " + std::to_string(n) + " documents;";
    for (size_t i = 0; i < 3; ++i) {
      line += std::string(" ") + split_name(static_cast<Split>(i)) + " ";
      line += s.ranges[i] ? range_text(*s.ranges[i]) : "none";
    }
    log_line(line);
  }
  return s;
}

// Whether split `split` of `s` holds a complete sample. Megatron would loop forever on one that
// does not; we leave it out of the split with a warning instead.
bool has_samples(const Source& s, Split split, bool log) {
  const auto& range = s.ranges[static_cast<size_t>(split)];
  if (range && tokens_in(*s.dataset, *range) >= 2) return true;
  if (log) {
    log_line(std::string(" > WARNING: the ") + split_name(split) + " split of " + s.prefix +
             " (documents " + (range ? range_text(*range) : std::string("none")) +
             ") has no complete sample; it is left out. A larger share in --split fixes it");
  }
  return false;
}

std::unique_ptr<GPTDataset> make_gpt(const Source& s, Split split,
                                     std::optional<int64_t> num_samples,
                                     const GPTDatasetConfig& config) {
  const DocumentRange range = *s.ranges[static_cast<size_t>(split)];
  if (config.log) {
    log_line(" > building the " + config.class_name + " " + split_name(split) + " split of " +
             s.prefix + ": " + std::to_string(range.size()) + " documents " + range_text(range));
  }
  return std::make_unique<GPTDataset>(s.dataset, range, num_samples, split, config);
}

// Megatron's _get_size_per_split_per_dataset for one split.
int64_t samples_for(int64_t target, double weight, double surplus) {
  const double first = std::ceil(static_cast<double>(target) * weight);
  return static_cast<int64_t>(std::ceil(first * (1.0 + surplus)));
}

// One split built from a blend: a GPTDataset for a single unweighted prefix, else a
// BlendedDataset, following BlendedMegatronDatasetBuilder over the sources that have samples.
std::unique_ptr<SampleSource> build_split(const std::vector<Source>& all_sources,
                                          const std::optional<std::vector<double>>& all_weights,
                                          Split split, std::optional<int64_t> num_samples,
                                          const GPTDataArgs& args, const GPTDatasetConfig& config) {
  if (num_samples && *num_samples <= 0) return nullptr;
  // No count (--full-validation): one epoch of each dataset, which a weighted blend cannot give
  // (Megatron asserts "size_is_none => weights_are_none").
  MEGATRON_CHECK(num_samples || !all_weights, "--full-validation evaluates one epoch of the ",
                 split_name(split),
                 " data, which a weighted blend does not define: drop the "
                 "weights from the blend (or --full-validation)");
  std::vector<const Source*> sources;
  std::optional<std::vector<double>> weights;
  if (all_weights) weights.emplace();
  for (size_t d = 0; d < all_sources.size(); ++d) {
    if (!has_samples(all_sources[d], split, config.log)) continue;
    sources.push_back(&all_sources[d]);
    if (weights) weights->push_back((*all_weights)[d]);
  }
  if (sources.empty()) return nullptr;
  if (sources.size() == 1 && !weights) return make_gpt(*sources[0], split, num_samples, config);

  if (weights) *weights = normalize_weights(*weights);
  std::vector<std::unique_ptr<GPTDataset>> parts;
  std::vector<double> part_weights;
  int64_t size = 0;
  for (size_t d = 0; d < sources.size(); ++d) {
    if (weights) {
      // Build a little more than the blend will take (the surplus), blend exactly the target.
      const double w = (*weights)[d];
      parts.push_back(make_gpt(*sources[d], split,
                               samples_for(*num_samples, w, args.mid_level_dataset_surplus),
                               config));
      size += samples_for(*num_samples, w, 0.0);
      part_weights.push_back(w);
    } else {
      // Unweighted: one epoch of each, weighted by its size.
      parts.push_back(make_gpt(*sources[d], split, std::nullopt, config));
      size += parts.back()->size();
      part_weights.push_back(static_cast<double>(parts.back()->size()));
    }
  }
  if (config.log && parts.size() == 1) {
    log_line(" > WARNING: building a BlendedDataset for a single " + config.class_name);
  }
  // Unweighted without a count: Megatron's exhaustive blend (every sample of each once).
  std::optional<int64_t> blend_size;
  if (num_samples) blend_size = weights ? size : std::min(size, *num_samples);
  return std::make_unique<BlendedDataset>(std::move(parts), std::move(part_weights), blend_size,
                                          config.path_to_cache, config.log);
}

}  // namespace

double numpy_sum(std::span<const double> v) {
  const size_t n = v.size();
  if (n < 8) {
    double res = 0.;
    for (double x : v) res += x;
    return res;
  }
  if (n <= kPairwiseBlock) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = v[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += v[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += v[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum(v.first(n2)) + numpy_sum(v.subspan(n2));
}

std::vector<double> normalize_weights(std::span<const double> weights) {
  const double sum = numpy_sum(weights);
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

void build_blending_indices(std::span<const double> weights, std::span<int16_t> dataset_index,
                            std::span<int64_t> dataset_sample_index) {
  MEGATRON_ASSERT(!weights.empty() && weights.size() < 32767, "1 to 32766 datasets");
  MEGATRON_ASSERT(dataset_index.size() == dataset_sample_index.size(), "index sizes differ");
  std::vector<int64_t> taken(weights.size(), 0);
  // The error w * k - c must round the product before subtracting, as Megatron's helpers (built
  // for baseline x86-64, without FMA) do: a fused multiply-add changes the last bit, and with it
  // the winner of near ties. The volatile product keeps the compiler from contracting the two.
  auto error_of = [&](size_t d, double k_double) {
    volatile double product = weights[d] * k_double;
    return product - static_cast<double>(taken[d]);
  };
  for (size_t k = 0; k < dataset_index.size(); ++k) {
    const double k_double = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_error = error_of(0, k_double);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = error_of(d, k_double);
      if (error > best_error) {  // strict: ties keep the lowest index
        best_error = error;
        best = d;
      }
    }
    dataset_index[k] = static_cast<int16_t>(best);
    dataset_sample_index[k] = taken[best]++;
  }
}

void build_exhaustive_blending_indices(std::span<const int64_t> sizes,
                                       std::span<int16_t> dataset_index,
                                       std::span<int64_t> dataset_sample_index) {
  MEGATRON_ASSERT(!sizes.empty() && sizes.size() < 32767, "1 to 32766 datasets");
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  MEGATRON_ASSERT(static_cast<int64_t>(dataset_index.size()) == total &&
                      dataset_sample_index.size() == dataset_index.size(),
                  "exhaustive blend: one entry per sample");
  std::vector<double> weights;
  for (int64_t n : sizes) weights.push_back(static_cast<double>(n) / static_cast<double>(total));
  std::vector<int64_t> taken(sizes.size(), 0);
  std::vector<bool> spent(sizes.size(), false);
  for (size_t d = 0; d < sizes.size(); ++d) spent[d] = sizes[d] == 0;
  for (size_t k = 0; k < dataset_index.size(); ++k) {
    const double k_double = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_error = std::numeric_limits<double>::lowest();
    for (size_t d = 0; d < sizes.size(); ++d) {  // ascending, as the std::set Megatron walks
      if (spent[d]) continue;
      volatile double product = weights[d] * k_double;  // rounded, as build_blending_indices
      const double error = product - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[k] = static_cast<int16_t>(best);
    dataset_sample_index[k] = taken[best]++;
    if (taken[best] == sizes[best]) spent[best] = true;
  }
}

std::string blended_dataset_description(std::span<const std::string> dataset_descriptions,
                                        Split split, std::span<const double> weights,
                                        std::optional<int64_t> size) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["class"] = "BlendedDataset";
  Json datasets = Json::array();
  for (const std::string& d : dataset_descriptions) datasets.push_back(Json::parse(d));
  j["datasets"] = datasets;
  j["split"] = split_name(split);
  if (size) {
    j["weights"] = std::vector<double>(weights.begin(), weights.end());
    j["size"] = *size;
  } else {  // Python's list of len() values: integers
    Json w = Json::array();
    for (double x : weights) w.push_back(static_cast<int64_t>(x));
    j["weights"] = w;
    j["size"] = nullptr;
  }
  return j.dump(4, ' ', true);
}

BlendedIndices load_or_build_blending_indices(std::span<const std::string> dataset_descriptions,
                                              std::span<const int64_t> dataset_sizes,
                                              std::span<const double> weights,
                                              std::optional<int64_t> blend_size, Split split,
                                              const std::string& cache_dir, bool log) {
  MEGATRON_ASSERT(dataset_descriptions.size() == weights.size() &&
                      dataset_sizes.size() == weights.size() && !weights.empty(),
                  "one description, size and weight per dataset");
  // Exhaustive (no size): the weights are the datasets' sizes, kept as they are.
  const std::vector<double> w =
      blend_size ? normalize_weights(weights) : std::vector<double>(weights.begin(), weights.end());
  int64_t size = 0;
  if (blend_size) {
    size = *blend_size;
  } else {
    for (int64_t n : dataset_sizes) size += n;
  }
  const std::string name = split_name(split);
  auto say = [&](const std::string& line) {
    if (log) log_line(line);
  };

  BlendedIndices b;
  std::optional<IndexCache> cache;
  bool loaded = false;
  if (!cache_dir.empty()) {
    cache.emplace(cache_dir, "BlendedDataset", name,
                  blended_dataset_description(dataset_descriptions, split, w, blend_size));
    std::string why;
    if (auto arrays = cache->load(kBlendedSuffixes, &why)) {
      b.dataset_index = std::move((*arrays)[0]);
      b.dataset_sample_index = std::move((*arrays)[1]);
      b.from_cache = true;
      why = check_blending_indices(b, w.size(), size);
      loaded = why.empty();
    }
    if (loaded) {
      say("Load the BlendedDataset " + name + " indices from " + cache->path(kBlendedSuffixes[0]));
    } else if (std::filesystem::exists(cache->path("description.txt")) ||
               std::filesystem::exists(cache->path(kBlendedSuffixes[0])) ||
               std::filesystem::exists(cache->path(kBlendedSuffixes[1]))) {
      say("> rebuilding the cached BlendedDataset " + name + " indices: " + why);
    }
  }
  if (!loaded) {
    say("Build and save the BlendedDataset " + name + " indices");
    b = BlendedIndices{NpyArray(NpyDType::kInt16, {size}), NpyArray(NpyDType::kInt64, {size}),
                       false};
    if (blend_size) {
      build_blending_indices(w, b.dataset_index.mutable_values<int16_t>(),
                             b.dataset_sample_index.mutable_values<int64_t>());
    } else {
      build_exhaustive_blending_indices(dataset_sizes, b.dataset_index.mutable_values<int16_t>(),
                                        b.dataset_sample_index.mutable_values<int64_t>());
    }
  }

  // Megatron raises IndexError here: the greedy order wants more of a dataset than was built.
  std::vector<int64_t> counts(w.size(), 0);
  for (int16_t d : b.dataset_index.values<int16_t>()) ++counts[static_cast<size_t>(d)];
  for (size_t d = 0; d < w.size(); ++d) {
    MEGATRON_CHECK(counts[d] <= dataset_sizes[d], "the ", name, " blend draws ", counts[d],
                   " samples from dataset ", d, " which has only ", dataset_sizes[d],
                   "; raise --mid-level-dataset-surplus (now ",
                   "too small for this blend), e.g. ten-fold");
  }

  if (!loaded) {
    if (cache) {
      const NpyArray* arrays[] = {&b.dataset_index, &b.dataset_sample_index};
      cache->save(kBlendedSuffixes, arrays);
    } else {
      say("> WARNING: cannot save the BlendedDataset indexes because no cache path is set");
    }
  }
  if (log) {
    std::string line = " > " + name + " blend of " + std::to_string(size) + " samples:";
    for (size_t d = 0; d < w.size(); ++d) {
      const double weight =
          blend_size ? w[d] : w[d] / static_cast<double>(std::max<int64_t>(size, 1));
      line += strprintf(" dataset %zu weight %.6f achieved %.6f;", d, weight,
                        size ? static_cast<double>(counts[d]) / static_cast<double>(size) : 0.0);
    }
    say(line);
  }
  return b;
}

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<GPTDataset>> datasets,
                               std::vector<double> weights, std::optional<int64_t> size,
                               const std::string& path_to_cache, bool log)
    : datasets_(std::move(datasets)) {
  MEGATRON_ASSERT(!datasets_.empty() && datasets_.size() == weights.size(),
                  "one weight per dataset");
  MEGATRON_ASSERT(!size || *size >= 0, "negative blend size");
  std::vector<std::string> descriptions;
  std::vector<int64_t> sizes;
  for (const auto& d : datasets_) {
    MEGATRON_ASSERT(
        d->split() == datasets_[0]->split() && d->seq_length() == datasets_[0]->seq_length(),
        "blended datasets share split and sequence length");
    descriptions.push_back(d->description());
    sizes.push_back(d->size());
  }
  for (double w : weights) MEGATRON_ASSERT(w > 0, "blend weights are positive");
  indices_ = load_or_build_blending_indices(descriptions, sizes, weights, size,
                                            datasets_[0]->split(), path_to_cache, log);
}

void BlendedDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample ", index,
                 " is outside the blended dataset's [0, ", size(), ")");
  const int64_t d = indices_.dataset_index.get(index);
  datasets_[static_cast<size_t>(d)]->sample(indices_.dataset_sample_index.get(index), out);
}

std::vector<int64_t> BlendedDataset::document_lengths(int64_t index) const {
  MEGATRON_CHECK(index >= 0 && index < size(), "sample ", index,
                 " is outside the blended dataset's [0, ", size(), ")");
  const int64_t d = indices_.dataset_index.get(index);
  return datasets_[static_cast<size_t>(d)]->document_lengths(
      indices_.dataset_sample_index.get(index));
}

std::array<int64_t, 3> megatron_split_num_samples(int64_t train_iters, int64_t global_batch_size,
                                                  int64_t eval_interval, int64_t eval_iters) {
  MEGATRON_CHECK(eval_interval > 0, "--eval-interval must be positive, got ", eval_interval);
  return {train_iters * global_batch_size,
          (train_iters / eval_interval + 1) * eval_iters * global_batch_size,
          eval_iters * global_batch_size};
}

GPTDatasets build_gpt_datasets(const GPTDataArgs& args) {
  GPTDatasetConfig config = args.config;
  const bool per_split = !args.train_data_path.empty() || !args.valid_data_path.empty() ||
                         !args.test_data_path.empty();
  MEGATRON_CHECK(!(per_split && !args.data_path.empty()),
                 "--data-path and --train/valid/test-data-path are exclusive; pass one or the "
                 "other");
  MEGATRON_CHECK(per_split || !args.data_path.empty(),
                 "no training data: pass --data-path (or --train-data-path, --valid-data-path, "
                 "--test-data-path)");
  MEGATRON_CHECK(args.mid_level_dataset_surplus >= 0,
                 "--mid-level-dataset-surplus must be >= 0, "
                 "got ",
                 args.mid_level_dataset_surplus);
  for (int64_t n : args.num_samples) {
    MEGATRON_CHECK(n >= 0, "negative number of samples requested: ", n);
  }
  const std::array<const char*, 3> kLabels = {"train:      ", "validation: ", "test:       "};
  auto count = [&](size_t i) -> std::optional<int64_t> {
    if (i == 1 && args.valid_one_epoch) return std::nullopt;
    return args.num_samples[i];
  };
  if (config.log) {
    log_line("> building train, validation, and test datasets for GPT ...");
    log_line(" > datasets target sizes (minimum size):");
    for (size_t i = 0; i < 3; ++i) {
      log_line(std::string("    ") + kLabels[i] +
               (count(i) ? std::to_string(*count(i)) : std::string("one epoch")));
    }
  }
  GPTDatasets built;

  std::array<std::unique_ptr<SampleSource>, 3> out;
  if (!per_split) {
    if (!config.split) config.split = kLegacyDefaultSplit;
    const SplitMatrix matrix = parse_split(*config.split);
    const Blend blend = parse_blend(args.data_path, "--data-path");
    std::vector<Source> sources;
    for (const std::string& p : blend.prefixes)
      sources.push_back(open_source(p, matrix, config.log, args));
    for (size_t i = 0; i < 3; ++i) {
      if (!matrix[i]) continue;
      out[i] = build_split(sources, blend.weights, static_cast<Split>(i), count(i), args, config);
    }
  } else {
    MEGATRON_CHECK(!config.split,
                   "--split does not apply with --train/valid/test-data-path "
                   "(each path is a whole split); drop --split");
    const std::array<const std::vector<std::string>*, 3> paths = {
        &args.train_data_path, &args.valid_data_path, &args.test_data_path};
    const std::array<const char*, 3> flags = {"--train-data-path", "--valid-data-path",
                                              "--test-data-path"};
    for (size_t i = 0; i < 3; ++i) {
      const Blend blend = parse_blend(*paths[i], flags[i]);
      if (blend.prefixes.empty()) continue;
      SplitMatrix spoof;
      spoof[i] = std::make_pair(0.0, 1.0);
      std::vector<Source> sources;
      for (const std::string& p : blend.prefixes)
        sources.push_back(open_source(p, spoof, config.log, args));
      // Megatron uses a single prefix directly even when it carries a weight here.
      const auto weights = blend.prefixes.size() == 1 ? std::nullopt : blend.weights;
      if (i == 1 && args.multiple_validation_sets && sources.size() > 1) {
        // One dataset per prefix, unweighted (Megatron's multiple_validation_sets).
        MEGATRON_CHECK(!weights || count(i),
                       "--multiple-validation-sets with --full-validation "
                       "evaluates each --valid-data-path prefix whole: drop the weights");
        for (size_t k = 0; k < sources.size(); ++k) {
          std::unique_ptr<SampleSource> set =
              build_split({sources[k]}, std::nullopt, Split::kValid, count(i), args, config);
          MEGATRON_CHECK(set != nullptr, "--valid-data-path ", blend.prefixes[k],
                         ": no validation samples (no documents, or too few tokens for one "
                         "sequence); drop it from the validation sets");
          if (k == 0) {
            out[i] = std::move(set);
          } else {
            built.more_valid.push_back(std::move(set));
          }
        }
        continue;
      }
      out[i] = build_split(sources, weights, static_cast<Split>(i), count(i), args, config);
    }
  }
  if (config.log) {
    for (size_t i = 0; i < 3; ++i) {
      log_line(std::string(" > ") + kLabels[i] +
               (out[i] ? std::to_string(out[i]->size()) + " samples" : std::string("none")));
    }
    log_line("> finished creating GPT datasets ...");
  }
  built.train = std::move(out[0]);
  built.valid = std::move(out[1]);
  built.test = std::move(out[2]);
  return built;
}

}  // namespace megatron
