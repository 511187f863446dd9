// BERT dataset: the sample mapping, sentence pairs, SOP labels, truncation and masking of
// BertDataset against bert_samples.py, an independent NumPy restatement of Megatron's
// BERTMaskedWordPieceDataset (NumPy's own RandomState draws the per-sample randomness there), on
// sentence datasets this test writes; plus the cache and the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/bert_wordpiece_tokenizer.h"
#include "data/indexed_dataset.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using Json = nlohmann::json;

// A WordPiece vocabulary of 300 pieces: the specials, then words and "##" continuations mixed,
// so whole-word candidates of several pieces occur.
std::string write_vocab(const std::string& dir) {
  std::ofstream out(dir + "/vocab.txt");
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) out << t << "\n";
  for (int i = 5; i < 300; ++i) out << (i % 3 == 0 ? "##p" : "w") << i << "\n";
  return dir + "/vocab.txt";
}

// Documents of 0 to 9 sentences of 1 to 40 word ids (5..299), one document with a sentence longer
// than 512 tokens, written as a sentence-level indexed dataset.
std::string write_sentences(const std::string& dir, uint32_t seed, int64_t docs) {
  const std::string prefix = dir + "/corpus_text_sentence";
  IndexedDatasetBuilder builder(prefix + ".bin", IndexDType::kUInt16);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> nsent(0, 9), len(1, 40), tok(5, 299);
  for (int64_t d = 0; d < docs; ++d) {
    const int n = d == 3 ? 3 : nsent(gen);
    for (int s = 0; s < n; ++s) {
      const int l = d == 3 && s == 1 ? 600 : len(gen);
      std::vector<int64_t> ids(static_cast<size_t>(l));
      for (int64_t& x : ids) x = tok(gen);
      builder.add_item(ids);
    }
    builder.end_document();
  }
  builder.finalize(prefix + ".idx");
  return prefix;
}

struct Case {
  std::string name;
  int64_t seed = 1234, seq_length = 64;
  DocumentRange docs{0, 60};
  std::optional<int64_t> num_samples = std::nullopt;
  double mask_prob = 0.15, short_seq_prob = 0.1;
  int64_t max_ngram = 3;
  bool full_word = true, longer = false, geometric = false, binary_head = true;
  int64_t extra_ids = 0;
};

Json spec_of(const Case& c, const std::string& prefix, const std::string& vocab) {
  return Json{{"name", c.name},
              {"prefix", prefix},
              {"vocab_file", vocab},
              {"vocab_extra_ids", c.extra_ids},
              {"documents", {c.docs.begin, c.docs.end}},
              {"num_samples", c.num_samples ? Json(*c.num_samples) : Json(nullptr)},
              {"seed", c.seed},
              {"sequence_length", c.seq_length},
              {"masking_probability", c.mask_prob},
              {"short_sequence_probability", c.short_seq_prob},
              {"masking_max_ngram", c.max_ngram},
              {"masking_do_full_word", c.full_word},
              {"masking_do_permutation", false},
              {"masking_use_longer_ngrams", c.longer},
              {"masking_use_geometric_distribution", c.geometric},
              {"classification_head", c.binary_head}};
}

BertDatasetConfig config_of(const Case& c, const std::string& cache) {
  BertDatasetConfig config;
  config.random_seed = c.seed;
  config.sequence_length = c.seq_length;
  config.split = "1";
  config.path_to_cache = cache;
  config.short_sequence_probability = c.short_seq_prob;
  config.masking.masking_probability = c.mask_prob;
  config.masking.masking_max_ngram = c.max_ngram;
  config.masking.masking_do_full_word = c.full_word;
  config.masking.masking_use_longer_ngrams = c.longer;
  config.masking.masking_use_geometric_distribution = c.geometric;
  config.classification_head = c.binary_head;
  config.log = false;
  return config;
}

TEST(BertDataset, SamplesEqualTheNumpyRestatementOfMegatron) {
  const std::string dir = testing::scratch_dir("bert_dataset_oracle");
  const std::string vocab = write_vocab(dir);
  const std::string prefix = write_sentences(dir, 7, 80);
  std::vector<Case> cases;
  cases.push_back({.name = "default"});
  cases.push_back({.name = "seed_count", .seed = 99, .num_samples = 500});
  cases.push_back({.name = "no_head", .seed = 5, .docs = {10, 80}, .binary_head = false});
  cases.push_back({.name = "short_all", .seq_length = 40, .short_seq_prob = 1.0});
  cases.push_back({.name = "no_short", .seq_length = 128, .short_seq_prob = 0.0});
  cases.push_back({.name = "dense_mask", .seed = 3, .mask_prob = 0.4, .max_ngram = 5});
  cases.push_back({.name = "pieces", .seed = 11, .full_word = false, .longer = true});
  cases.push_back({.name = "spanbert", .seed = 17, .max_ngram = 10, .geometric = true});
  cases.push_back({.name = "extra_ids", .seed = 23, .extra_ids = 4});

  Json spec = Json::array();
  for (const Case& c : cases) spec.push_back(spec_of(c, prefix, vocab));
  std::ofstream(dir + "/spec.json") << spec.dump();
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_BERT_ORACLE +
                          " --spec " + dir + "/spec.json --out " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  int64_t masked_total = 0, random_total = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const BertWordPieceTokenizer tok("BertWordPieceLowerCase", vocab, c.extra_ids);
    const BertDataset ds(data, c.docs, c.num_samples, Split::kTrain,
                         config_of(c, dir + "/cache_" + c.name), tok);
    std::ifstream in(dir + "/" + c.name + ".json");
    const Json want = Json::parse(in);
    ASSERT_EQ(ds.size(), want.at("length").get<int64_t>());
    const Json& index = want.at("sample_index");
    ASSERT_EQ(static_cast<int64_t>(index.size()), ds.size());
    for (int64_t i = 0; i < ds.size(); ++i) {
      for (int k = 0; k < 3; ++k)
        ASSERT_EQ(ds.sample_index().get(3 * i + k), index[i][k].get<int64_t>()) << "row " << i;
    }
    const Json& samples = want.at("samples");
    std::vector<int64_t> record(static_cast<size_t>(ds.sample_width()));
    for (size_t i = 0; i < samples.size(); ++i) {
      ds.sample(static_cast<int64_t>(i), record.data());
      const BertRecord r(record.data(), c.seq_length);
      const Json& w = samples[i];
      auto same = [&](std::span<const int64_t> got, const char* key) {
        ASSERT_EQ(std::vector<int64_t>(got.begin(), got.end()),
                  w.at(key).get<std::vector<int64_t>>())
            << "sample " << i << " field " << key;
      };
      same(r.text, "text");
      same(r.types, "types");
      same(r.labels, "labels");
      same(r.padding_mask, "padding_mask");
      same(r.loss_mask, "loss_mask");
      ASSERT_EQ(r.is_random, w.at("is_random").get<int64_t>()) << "sample " << i;
      ASSERT_EQ(r.truncated, w.at("truncated").get<int64_t>()) << "sample " << i;
      for (int64_t x : r.loss_mask) masked_total += x;
      random_total += r.is_random;
    }
  }
  // The comparison must have covered masking and both SOP labels, not empty samples.
  EXPECT_GT(masked_total, 1000);
  EXPECT_GT(random_total, 100);
}

TEST(BertDataset, CachesTheSampleIndexAndRefusesDocumentDatasets) {
  const std::string dir = testing::scratch_dir("bert_dataset_cache");
  const std::string vocab = write_vocab(dir);
  const std::string prefix = write_sentences(dir, 9, 40);
  const BertWordPieceTokenizer tok("BertWordPieceLowerCase", vocab, 0);
  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  Case c{.name = "cache", .docs = {0, 40}};
  const BertDatasetConfig config = config_of(c, dir + "/cache");
  const BertDataset built(data, c.docs, std::nullopt, Split::kValid, config, tok);
  // Megatron's file names: <md5>-BERTMaskedWordPieceDataset-sample_index.npy, no split part.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/cache")) {
    const std::string f = e.path().filename().string();
    EXPECT_TRUE(f.ends_with("-BERTMaskedWordPieceDataset-sample_index.npy") ||
                f.ends_with("-BERTMaskedWordPieceDataset-description.txt"))
        << f;
    ++files;
  }
  EXPECT_EQ(files, 2);
  const BertDataset loaded(data, c.docs, std::nullopt, Split::kValid, config, tok);
  ASSERT_EQ(loaded.size(), built.size());
  for (int64_t i = 0; i < 3 * built.size(); ++i)
    ASSERT_EQ(loaded.sample_index().get(i), built.sample_index().get(i));

  // A `_text_document` dataset: one sequence per document.
  const std::string doc_prefix = dir + "/corpus_text_document";
  {
    IndexedDatasetBuilder b(doc_prefix + ".bin", IndexDType::kUInt16);
    for (int d = 0; d < 5; ++d) {
      const std::vector<int64_t> ids = {5, 6, 7, 8};
      b.add_item(ids);
      b.end_document();
    }
    b.finalize(doc_prefix + ".idx");
  }
  auto docs = std::make_shared<const IndexedDataset>(IndexedDataset::open(doc_prefix));
  try {
    BertDataset(docs, {0, 5}, std::nullopt, Split::kTrain, config, tok);
    ADD_FAILURE() << "accepted a _text_document dataset";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--split-sentences"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(doc_prefix), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
