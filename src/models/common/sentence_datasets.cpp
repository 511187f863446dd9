// Sentence-level datasets per split (see the header).
#include "models/common/sentence_datasets.h"

#include <array>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

namespace {

// The one prefix of a --data-path style list ("prefix" or "weight prefix").
std::string single_prefix(const std::vector<std::string>& args, const char* flag,
                          const std::string& model) {
  std::vector<std::string> tokens;
  for (const std::string& a : args) {
    std::istringstream in(a);
    for (std::string t; in >> t;) tokens.push_back(t);
  }
  if (tokens.empty()) return "";
  MEGATRON_CHECK(tokens.size() == 1 || tokens.size() == 2, flag, ": ", model,
                 " trains on one `_text_sentence` dataset per split; blends of several prefixes "
                 "are not supported for it yet (merge the JSON-lines inputs and preprocess once)");
  return tokens.back();
}

}  // namespace

Datasets sentence_datasets(const DataConfig& a, const SampleCounts& n, const std::string& model,
                           const SentenceSourceFn& make, bool log) {
  MEGATRON_CHECK(!a.mock_data, "--mock-data makes GPT documents; ", model,
                 " needs sentences: pass --data-path with a `megatron preprocess "
                 "--split-sentences` dataset");
  const std::array<int64_t, 3> counts = {n.train, n.valid, n.test};
  std::array<std::unique_ptr<SampleSource>, 3> out;
  if (log) log_line("> building train, validation, and test datasets for " + model + " ...");
  const std::string prefix = single_prefix(a.data_path, "--data-path", model);
  if (!prefix.empty()) {
    MEGATRON_CHECK(
        a.train_data_path.empty() && a.valid_data_path.empty() && a.test_data_path.empty(),
        "--data-path and --train/valid/test-data-path are exclusive; pass one or the other");
    auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
    const auto ranges = split_document_ranges(a.split, data->num_documents());
    for (size_t i = 0; i < 3; ++i) {
      if (!ranges[i] || ranges[i]->size() == 0 || counts[i] <= 0) continue;
      out[i] = make(data, *ranges[i], counts[i], static_cast<Split>(i), a.split);
    }
  } else {
    const std::array<const std::vector<std::string>*, 3> paths = {
        &a.train_data_path, &a.valid_data_path, &a.test_data_path};
    const std::array<const char*, 3> flags = {"--train-data-path", "--valid-data-path",
                                              "--test-data-path"};
    for (size_t i = 0; i < 3; ++i) {
      const std::string p = single_prefix(*paths[i], flags[i], model);
      if (p.empty() || counts[i] <= 0) continue;
      auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(p));
      out[i] = make(data, DocumentRange{0, data->num_documents()}, counts[i], static_cast<Split>(i),
                    std::nullopt);
    }
  }
  MEGATRON_CHECK(out[0] != nullptr, "no training data for ", model,
                 ": pass --data-path (a `_text_sentence` dataset) with a non-zero training share "
                 "in --split, or --train-data-path");
  if (log) {
    const char* names[] = {"train", "validation", "test"};
    for (size_t i = 0; i < 3; ++i)
      log_line(std::string(" > ") + names[i] + ": " +
               (out[i] ? std::to_string(out[i]->size()) + " samples" : std::string("none")));
  }
  Datasets d;
  d.train = std::move(out[0]);
  d.valid = std::move(out[1]);
  d.test = std::move(out[2]);
  return d;
}

}  // namespace megatron
