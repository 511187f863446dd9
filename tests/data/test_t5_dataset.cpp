// T5 dataset: the sample index, span corruption, sentinels, padding and masks of T5Dataset against
// t5_samples.py, an independent NumPy restatement of Megatron's T5MaskedWordPieceDataset (NumPy's
// own RandomState draws the per-sample randomness there), for several seeds and (encoder, decoder)
// lengths on sentence datasets this test writes; plus the description, the cache and the
// refusals (including the samples Megatron cannot make, sample for sample).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "data/bert_wordpiece_tokenizer.h"
#include "data/indexed_dataset.h"
#include "data/t5_dataset.h"
#include "data/tokenizer.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using Json = nlohmann::json;

constexpr int64_t kSep = 3, kCls = 1;

// A WordPiece vocabulary of 300 pieces: the specials ([PAD] at 2, so padding with 0 would show;
// [EOS] present, so only [BOS] is appended), then words and "##" continuations mixed.
std::string write_vocab(const std::string& dir) {
  std::ofstream out(dir + "/vocab.txt");
  for (const char* t : {"[UNK]", "[CLS]", "[PAD]", "[SEP]", "[MASK]", "[EOS]"}) out << t << "\n";
  for (int i = 6; i < 300; ++i) out << (i % 3 == 0 ? "##p" : "w") << i << "\n";
  return dir + "/vocab.txt";
}

// Documents of 0 to 9 sentences of 1 to 40 ids (words and pieces, with a few [SEP] and [CLS] ids,
// which masking skips and whole words join across), one document with a sentence longer than 512
// tokens, written as a sentence-level indexed dataset.
std::string write_sentences(const std::string& dir, uint32_t seed, int64_t docs) {
  const std::string prefix = dir + "/corpus_text_sentence";
  IndexedDatasetBuilder builder(prefix + ".bin", IndexDType::kUInt16);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> nsent(0, 9), len(1, 40), tok(6, 299), special(0, 99);
  for (int64_t d = 0; d < docs; ++d) {
    const int n = d == 3 ? 3 : nsent(gen);
    for (int s = 0; s < n; ++s) {
      const int l = d == 3 && s == 1 ? 600 : len(gen);
      std::vector<int64_t> ids(static_cast<size_t>(l));
      for (int64_t& x : ids) {
        const int r = special(gen);
        x = r < 2 ? kSep : r < 3 ? kCls : tok(gen);
      }
      builder.add_item(ids);
    }
    builder.end_document();
  }
  builder.finalize(prefix + ".idx");
  return prefix;
}

struct Case {
  std::string name;
  int64_t seed = 1234, enc = 64, dec = 32;
  DocumentRange docs{0, 80};
  std::optional<int64_t> num_samples = std::nullopt;
  double mask_prob = 0.15, short_seq_prob = 0.1;
  int64_t max_ngram = 10;
  bool full_word = true, longer = false, geometric = true;
  int64_t extra_ids = 100;
  std::string tokenizer_json = "null";
};

Json spec_of(const Case& c, const std::string& prefix, const std::string& vocab) {
  return Json{{"name", c.name},
              {"prefix", prefix},
              {"vocab_file", vocab},
              {"vocab_extra_ids", c.extra_ids},
              {"documents", {c.docs.begin, c.docs.end}},
              {"num_samples", c.num_samples ? Json(*c.num_samples) : Json(nullptr)},
              {"index_split", "train"},
              {"split", "1"},
              {"tokenizer", Json::parse(c.tokenizer_json)},
              {"seed", c.seed},
              {"sequence_length", c.enc},
              {"sequence_length_decoder", c.dec},
              {"masking_probability", c.mask_prob},
              {"short_sequence_probability", c.short_seq_prob},
              {"masking_max_ngram", c.max_ngram},
              {"masking_do_full_word", c.full_word},
              {"masking_use_longer_ngrams", c.longer},
              {"masking_use_geometric_distribution", c.geometric}};
}

T5DatasetConfig config_of(const Case& c, const std::string& cache) {
  T5DatasetConfig config;
  config.random_seed = c.seed;
  config.sequence_length = c.enc;
  config.sequence_length_decoder = c.dec;
  config.split = "1";
  config.tokenizer_json = c.tokenizer_json;
  config.path_to_cache = cache;
  config.short_sequence_probability = c.short_seq_prob;
  config.masking.masking_probability = c.mask_prob;
  config.masking.masking_max_ngram = c.max_ngram;
  config.masking.masking_do_full_word = c.full_word;
  config.masking.masking_use_longer_ngrams = c.longer;
  config.masking.masking_use_geometric_distribution = c.geometric;
  config.log = false;
  return config;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(T5Dataset, DefaultConfigIsPretrainT5s) {
  const T5DatasetConfig c;
  EXPECT_EQ(c.masking.masking_max_ngram, 10);
  EXPECT_TRUE(c.masking.masking_do_full_word);
  EXPECT_TRUE(c.masking.masking_use_geometric_distribution);
  EXPECT_FALSE(c.masking.masking_use_longer_ngrams);
  EXPECT_DOUBLE_EQ(c.masking.masking_probability, 0.15);
  EXPECT_DOUBLE_EQ(c.short_sequence_probability, 0.1);
  EXPECT_EQ(T5Record::width(5, 3), 2 * 5 + 4 * 3 + 1);
}

TEST(T5Dataset, SamplesEqualTheNumpyRestatementOfMegatron) {
  const std::string dir = testing::scratch_dir("t5_dataset_oracle");
  const std::string vocab = write_vocab(dir);
  const std::string prefix = write_sentences(dir, 7, 80);
  std::vector<Case> cases;
  cases.push_back({.name = "default"});
  cases.push_back({.name = "seed_count", .seed = 99, .enc = 128, .dec = 48, .num_samples = 400});
  cases.push_back({.name = "short_all", .seed = 7, .enc = 40, .dec = 16, .short_seq_prob = 1.0});
  cases.push_back({.name = "long_no_short",
                   .seed = 3,
                   .enc = 256,
                   .dec = 80,
                   .docs = {10, 80},
                   .short_seq_prob = 0.0});
  // Some samples need more than 64 decoder positions, some not: Megatron's assert, per sample.
  cases.push_back({.name = "dense", .seed = 5, .enc = 96, .dec = 64, .mask_prob = 0.4});
  cases.push_back({.name = "short_decoder", .seed = 11, .enc = 128, .dec = 12});
  cases.push_back({.name = "few_sentinels", .seed = 13, .mask_prob = 0.3, .extra_ids = 2});
  cases.push_back({.name = "inverse_n",
                   .seed = 17,
                   .enc = 72,
                   .dec = 40,
                   .max_ngram = 3,
                   .full_word = false,
                   .longer = true,
                   .geometric = false});
  cases.push_back(
      {.name = "max_seed",
       .seed = 2147483647,
       .num_samples = 300,
       .tokenizer_json = R"({"class": "_BertWordPieceTokenizer", "vocab_extra_ids": 100})"});

  Json spec = Json::array();
  for (const Case& c : cases) spec.push_back(spec_of(c, prefix, vocab));
  std::ofstream(dir + "/spec.json") << spec.dump();
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_T5_ORACLE +
                          " --spec " + dir + "/spec.json --out " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  int64_t compared = 0, span_total = 0, truncated_total = 0;
  std::map<std::string, int64_t> refused;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const BertWordPieceTokenizer tok("BertWordPieceLowerCase", vocab, c.extra_ids);
    const std::string cache = dir + "/cache_" + c.name;
    const T5Dataset ds(data, c.docs, c.num_samples, Split::kTrain, config_of(c, cache), tok);
    const Json want = Json::parse(read_text(dir + "/" + c.name + ".json"));
    // The description and Megatron's cache file names, <md5>-T5MaskedWordPieceDataset-<suffix>.
    const std::string description = want.at("description").get<std::string>();
    EXPECT_EQ(ds.description(), description);
    const std::string stem =
        cache + "/" + want.at("description_md5").get<std::string>() + "-T5MaskedWordPieceDataset-";
    EXPECT_TRUE(std::filesystem::exists(stem + "sample_index.npy")) << stem;
    EXPECT_EQ(read_text(stem + "description.txt"), description);
    // The special ids the two sides resolved (the oracle from the vocab file, as Megatron).
    const Json& sp = want.at("special_ids");
    EXPECT_EQ(tok.special_tokens().bos, sp.at("bos").get<int64_t>());
    EXPECT_EQ(tok.special_tokens().eos, sp.at("eos").get<int64_t>());
    EXPECT_EQ(tok.special_tokens().additional, sp.at("sentinels").get<std::vector<int64_t>>());

    ASSERT_EQ(ds.size(), want.at("length").get<int64_t>());
    const Json& index = want.at("sample_index");
    ASSERT_EQ(static_cast<int64_t>(index.size()), ds.size());
    for (int64_t i = 0; i < ds.size(); ++i) {
      for (int k = 0; k < 3; ++k)
        ASSERT_EQ(ds.sample_index().get(3 * i + k), index[i][k].get<int64_t>()) << "row " << i;
    }
    const Json& samples = want.at("samples");
    ASSERT_EQ(static_cast<int64_t>(samples.size()), ds.size());
    std::vector<int64_t> record(static_cast<size_t>(ds.sample_width()));
    for (size_t i = 0; i < samples.size(); ++i) {
      const Json& w = samples[i];
      if (w.contains("error")) {
        // Megatron fails this sample (assert or IndexError); we refuse it, naming the flag.
        const std::string kind = w.at("error").get<std::string>();
        const std::string flag = kind == "sentinels" ? "--vocab-extra-ids"
                                 : kind == "decoder" ? "--decoder-seq-length"
                                                     : "--encoder-seq-length";
        try {
          ds.sample(static_cast<int64_t>(i), record.data());
          ADD_FAILURE() << "sample " << i << " made; Megatron fails it (" << kind << ")";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(flag), std::string::npos)
              << "sample " << i << ": " << e.what();
        }
        ++refused[kind];
        continue;
      }
      std::fill(record.begin(), record.end(), -7);
      ds.sample(static_cast<int64_t>(i), record.data());
      const T5Record r(record.data(), c.enc, c.dec);
      auto same = [&](std::span<const int64_t> got, const char* key) {
        ASSERT_EQ(std::vector<int64_t>(got.begin(), got.end()),
                  w.at(key).get<std::vector<int64_t>>())
            << "sample " << i << " field " << key;
      };
      same(r.text_enc, "text_enc");
      same(r.text_dec, "text_dec");
      same(r.labels, "labels");
      same(r.loss_mask, "loss_mask");
      same(r.enc_mask, "enc_mask");
      same(r.dec_mask, "dec_mask");
      ASSERT_EQ(r.truncated, w.at("truncated").get<int64_t>()) << "sample " << i;
      ++compared;
      const auto& sentinels = tok.special_tokens().additional;
      for (int64_t x : r.text_enc)
        span_total += std::find(sentinels.begin(), sentinels.end(), x) != sentinels.end();
      truncated_total += r.truncated;
    }
  }
  // The comparison must have covered real span corruption, truncation and every refusal.
  EXPECT_GT(compared, 1000);
  EXPECT_GT(span_total, 800);
  EXPECT_GT(truncated_total, 50);
  EXPECT_GT(refused["decoder"], 10);
  EXPECT_GT(refused["sentinels"], 10);
  EXPECT_EQ(refused["encoder"], 0);  // cannot happen: the encoder input never exceeds the target
}

TEST(T5Dataset, CachesTheSampleIndex) {
  const std::string dir = testing::scratch_dir("t5_dataset_cache");
  const std::string vocab = write_vocab(dir);
  const std::string prefix = write_sentences(dir, 9, 40);
  const BertWordPieceTokenizer tok("BertWordPieceCase", vocab, 10);
  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  const Case c{.name = "cache", .docs = {0, 40}};
  const T5DatasetConfig config = config_of(c, dir + "/cache");
  const T5Dataset built(data, c.docs, 250, Split::kValid, config, tok);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/cache")) {
    const std::string f = e.path().filename().string();
    EXPECT_TRUE(f.ends_with("-T5MaskedWordPieceDataset-sample_index.npy") ||
                f.ends_with("-T5MaskedWordPieceDataset-description.txt"))
        << f;
    ++files;
  }
  EXPECT_EQ(files, 2);
  const T5Dataset loaded(data, c.docs, 250, Split::kValid, config, tok);
  ASSERT_EQ(loaded.size(), built.size());
  ASSERT_GE(built.size(), 250);
  for (int64_t i = 0; i < 3 * built.size(); ++i)
    ASSERT_EQ(loaded.sample_index().get(i), built.sample_index().get(i));
  std::vector<int64_t> a(static_cast<size_t>(built.sample_width())), b(a.size());
  for (int64_t i = 0; i < 20; ++i) {
    built.sample(i, a.data());
    loaded.sample(i, b.data());
    ASSERT_EQ(a, b) << "sample " << i;
  }
  // Another decoder length is another dataset: its own description, its own cache files.
  T5DatasetConfig other = config;
  other.sequence_length_decoder = c.dec + 1;
  const T5Dataset third(data, c.docs, 250, Split::kValid, other, tok);
  EXPECT_NE(third.description(), built.description());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir + "/cache"),
                          std::filesystem::directory_iterator()),
            4);
}

void expect_refused(const std::function<void()>& build, const std::vector<std::string>& words) {
  try {
    build();
    ADD_FAILURE() << "accepted; expected a refusal naming " << words.front();
  } catch (const InvalidArgument& e) {
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(T5Dataset, Refusals) {
  const std::string dir = testing::scratch_dir("t5_dataset_refusals");
  const std::string vocab = write_vocab(dir);
  const std::string prefix = write_sentences(dir, 9, 40);
  auto data = std::make_shared<const IndexedDataset>(IndexedDataset::open(prefix));
  const BertWordPieceTokenizer tok("BertWordPieceLowerCase", vocab, 100);
  const Case c{.name = "refuse", .docs = {0, 40}};
  const T5DatasetConfig config = config_of(c, dir + "/cache");

  // No sentinels: Megatron asserts on additional_special_tokens_ids.
  const BertWordPieceTokenizer plain("BertWordPieceLowerCase", vocab, 0);
  expect_refused([&] { T5Dataset(data, c.docs, std::nullopt, Split::kTrain, config, plain); },
                 {"--vocab-extra-ids"});
  // Not a WordPiece tokenizer.
  TokenizerArgs null_args;
  null_args.type = "NullTokenizer";
  null_args.vocab_size = 300;
  const auto null_tok = build_tokenizer(null_args);
  expect_refused([&] { T5Dataset(data, c.docs, std::nullopt, Split::kTrain, config, *null_tok); },
                 {"WordPiece", "--tokenizer-type"});
  // Encoder too short to hold a target of two tokens plus [BOS]/[EOS]'s room.
  T5DatasetConfig tiny = config;
  tiny.sequence_length = 3;
  expect_refused([&] { T5Dataset(data, c.docs, std::nullopt, Split::kTrain, tiny, tok); },
                 {"--encoder-seq-length"});
  T5DatasetConfig no_dec = config;
  no_dec.sequence_length_decoder = 0;
  expect_refused([&] { T5Dataset(data, c.docs, std::nullopt, Split::kTrain, no_dec, tok); },
                 {"--decoder-seq-length"});

  // A `_text_document` dataset (one sequence per document) is taken, as Megatron takes it: each
  // document is one sentence of the mapping.
  const std::string doc_prefix = dir + "/corpus_text_document";
  {
    IndexedDatasetBuilder b(doc_prefix + ".bin", IndexDType::kUInt16);
    for (int d = 0; d < 5; ++d) {
      const std::vector<int64_t> ids = {6, 7, 8, 9};
      b.add_item(ids);
      b.end_document();
    }
    b.finalize(doc_prefix + ".idx");
  }
  auto docs = std::make_shared<const IndexedDataset>(IndexedDataset::open(doc_prefix));
  {
    const T5Dataset from_docs(docs, {0, 5}, std::nullopt, Split::kTrain, config, tok);
    ASSERT_GT(from_docs.size(), 0);
    std::vector<int64_t> rec(static_cast<size_t>(from_docs.sample_width()));
    from_docs.sample(0, rec.data());
    const T5Record r(rec.data(), config.sequence_length, config.sequence_length_decoder);
    EXPECT_EQ(r.enc_mask[0], 1);
    EXPECT_EQ(r.loss_mask[0], 1);
  }

  // A decoder too short for the masked spans: the sample is refused, naming the flag.
  T5DatasetConfig short_dec = config;
  short_dec.sequence_length_decoder = 2;
  const T5Dataset ds(data, c.docs, std::nullopt, Split::kTrain, short_dec, tok);
  std::vector<int64_t> record(static_cast<size_t>(ds.sample_width()));
  int64_t refused = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    try {
      ds.sample(i, record.data());
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--decoder-seq-length"), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  expect_refused([&] { ds.sample(ds.size(), record.data()); }, {"outside"});
}

}  // namespace
}  // namespace megatron
