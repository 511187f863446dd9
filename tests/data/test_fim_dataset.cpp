// Fill-in-the-middle samples (--fim-data) against Megatron core 0.19's GPTFIMDataset restated in
// Python (fim_oracle.py, with NumPy's RandomState) over a byte-level tokenizer.json written here:
// PSM, SPM and mixed layouts, --fim-split-sample fragments, --fim-no-prefix, rate 0, on samples
// cut anywhere from documents of ASCII, accented, CJK and 4-byte characters (so that decoding
// meets cut characters and the boundaries are code points), with EOD and file separators.
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/fim_dataset.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int64_t>;

// The oracle's test tokenizer (fim_oracle.py --write-tokenizer): byte-level BPE with a few
// merges, the FIM tokens and <file_sep> special, <keep> not, <s> put before every text.
std::string write_tokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_FIM_ORACLE +
                          " --write-tokenizer " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return path;
}

// Documents of source files: ASCII code, accents, CJK, an emoji (4 bytes), the non-special added
// token, files separated by <file_sep>.
std::vector<std::string> documents() {
  std::vector<std::string> docs;
  for (int d = 0; d < 12; ++d) {
    std::string doc;
    for (int f = 0; f < 1 + d % 3; ++f) {
      if (f > 0) doc += "<file_sep>";
      doc += (d + f) % 4 == 0 ? "import the_module as m\n" : "def f" + std::to_string(d) + "():\n";
      doc += "    return \"caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\" + str(" +
             std::to_string(d * 7 + f) + ")  # the interpreter <keep> here\n";
      doc += "# rather fine defer on the answer\n";
    }
    docs.push_back(doc);
  }
  return docs;
}

struct Variant {
  const char* name;
  double rate, spm_rate;
  const char* split;  // "" none
  std::optional<double> fragment_rate;
  std::optional<std::string> no_prefix;
};

std::string run_oracle(const std::string& dir, const Json& spec) {
  std::ofstream(dir + "/cases.json") << spec.dump();
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_FIM_ORACLE +
                          " --spec " + dir + "/cases.json --out " + dir + "/results.json";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir + "/results.json";
}

TEST(FimDataset, SamplesEqualMegatronsRestated) {
  const std::string dir = testing::scratch_dir("fim_oracle");
  const HuggingFaceTokenizer tok(write_tokenizer(dir));
  FimConfig base;
  const FimTokens ids_default = fim_tokens(base, tok);

  // One token stream of the documents, EOD after each; samples of 97 ids cut every 37 ids.
  Ids stream;
  Json texts = Json::array();
  for (const std::string& doc : documents()) {
    const Ids ids = tok.encode(doc);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(ids_default.eod);
    texts.push_back(doc);
  }
  constexpr size_t kWidth = 97;
  std::vector<Ids> samples;
  for (size_t at = 0; at + kWidth <= stream.size(); at += 37)
    samples.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(at),
                         stream.begin() + static_cast<std::ptrdiff_t>(at + kWidth));
  ASSERT_GE(samples.size(), 40u);
  // Megatron's quirks, built by hand: a sample ending in EOD (an empty last segment, which still
  // becomes the three sentinels and the template's <s> when drawn), consecutive EODs (empty
  // segments dropped with their EOD), a segment of special tokens only (no text: randint over
  // one position draws nothing) and a sample of a single segment with no EOD.
  const Ids doc = tok.encode("def g():\n    return 1  # caf\xC3\xA9\n");
  const int64_t eod = ids_default.eod;
  auto quirk = [&](std::initializer_list<Ids> parts) {
    Ids s;
    for (const Ids& p : parts) s.insert(s.end(), p.begin(), p.end());
    s.resize(kWidth, doc[3]);
    return s;
  };
  const Ids specials = {ids_default.prefix, ids_default.middle, tok.token_to_id("<s>")};
  for (int k = 0; k < 6; ++k) {
    samples.push_back(quirk({doc, doc, doc, doc}));  // filled up to the width: no EOD at all
    Ids ends(samples.back().begin(), samples.back().end() - 1);
    ends.push_back(eod);
    samples.push_back(ends);
    samples.push_back(quirk({{eod, eod}, doc, {eod, eod, eod}, doc, {eod}, specials, {eod}, doc}));
    samples.push_back(quirk({specials, {eod}, doc, {eod}, specials}));
  }

  const Variant variants[] = {
      {"psm", 1.0, 0.0, "", std::nullopt, std::nullopt},
      {"spm", 1.0, 1.0, "", std::nullopt, std::nullopt},
      {"mixed", 0.5, 0.5, "", std::nullopt, std::nullopt},
      {"split", 0.9, 0.5, "<file_sep>", 0.5, std::nullopt},
      {"no_prefix", 1.0, 0.5, "<file_sep>", 1.0, std::string("import")},
      {"off", 0.0, 0.5, "", std::nullopt, std::nullopt},
  };
  Json cases = Json::array();
  std::map<std::string, Ids> got;
  for (const Variant& v : variants) {
    FimConfig c;
    c.rate = v.rate;
    c.spm_rate = v.spm_rate;
    c.split_sample = v.split;
    c.fragment_rate = v.fragment_rate;
    c.no_prefix = v.no_prefix;
    const FimTokens t = fim_tokens(c, tok);
    for (size_t i = 0; i < samples.size(); ++i) {
      const uint32_t seed = fim_sample_seed(1234, 0, static_cast<int64_t>(i));
      NumpyRandomState rng(seed);
      const std::string name = std::string(v.name) + "_" + std::to_string(i);
      got[name] = fim_sample(samples[i], c, t, tok, rng);
      cases.push_back({{"name", name},
                       {"sample", samples[i]},
                       {"seed", seed},
                       {"rate", v.rate},
                       {"spm_rate", v.spm_rate},
                       {"fragment_rate", v.fragment_rate ? Json(*v.fragment_rate) : Json()},
                       {"no_prefix", v.no_prefix ? Json(*v.no_prefix) : Json()},
                       {"tokens",
                        {{"prefix", t.prefix},
                         {"middle", t.middle},
                         {"suffix", t.suffix},
                         {"pad", t.pad},
                         {"eod", t.eod},
                         {"split", t.split >= 0 ? Json(t.split) : Json()}}}});
    }
  }
  std::ifstream in(run_oracle(
      dir, {{"tokenizer", dir + "/tokenizer.json"}, {"cases", cases}, {"texts", texts}}));
  const Json want = Json::parse(in);

  // The restated tokenizer encodes the documents as the C++ one does (else the comparison below
  // would test two tokenizers, not the permutation).
  for (size_t d = 0; d < texts.size(); ++d)
    EXPECT_EQ(want["__encode__"][d].get<Ids>(), tok.encode(texts[d].get<std::string>())) << d;
  std::map<std::string, int> changed;
  for (const auto& [name, ids] : got) {
    ASSERT_TRUE(want.contains(name)) << name;
    const Ids expected = want[name].get<Ids>();
    if (ids != expected) {
      size_t k = 0;
      while (k < std::min(ids.size(), expected.size()) && ids[k] == expected[k]) ++k;
      ADD_FAILURE() << name << ": first difference at " << k << ": got "
                    << ::testing::PrintToString(
                           Ids(ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end()))
                    << ", Megatron's "
                    << ::testing::PrintToString(
                           Ids(expected.begin() + static_cast<std::ptrdiff_t>(k), expected.end()));
    }
    EXPECT_EQ(ids.size(), kWidth) << name;
    const size_t at = name.rfind('_');
    const size_t index = std::stoul(name.substr(at + 1));
    if (ids != samples[index]) ++changed[name.substr(0, at)];
  }
  // The checks above are not about unchanged samples: every permuting variant changed most.
  // At rate 0 only Megatron's cut changes a sample: an EOD that ends an empty segment (at the
  // start, or after another EOD) is dropped and the sample padded.
  const auto n = static_cast<int>(samples.size());
  int dropped = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    Ids kept;
    for (size_t k = 0; k < kWidth; ++k) {
      const bool empty_segment = k == 0 || samples[i][k - 1] == ids_default.eod;
      if (samples[i][k] != ids_default.eod || !empty_segment) kept.push_back(samples[i][k]);
    }
    dropped += kept.size() < kWidth;
    kept.resize(kWidth, ids_default.pad);
    EXPECT_EQ(got["off_" + std::to_string(i)], kept) << i;
  }
  EXPECT_EQ(changed["off"], dropped);
  for (const char* v : {"psm", "spm", "no_prefix"}) EXPECT_GT(changed[v], n * 3 / 4) << v;
  for (const char* v : {"mixed", "split"}) EXPECT_GT(changed[v], n / 4) << v;
  // Layouts: PSM starts a permuted first segment with <fim_prefix> and never puts <fim_suffix>
  // right after it; SPM always does.
  int spm_pairs = 0, psm_pairs = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Ids& s = got["spm_" + std::to_string(i)];
    const Ids& p = got["psm_" + std::to_string(i)];
    for (size_t k = 0; k + 1 < kWidth; ++k) {
      spm_pairs += s[k] == ids_default.prefix && s[k + 1] == ids_default.suffix;
      psm_pairs += p[k] == ids_default.prefix && p[k + 1] == ids_default.suffix;
    }
  }
  EXPECT_GT(spm_pairs, n);
  EXPECT_LT(psm_pairs, spm_pairs / 4);  // only where a prefix text was empty
}

// A vector of fixed samples.
class Samples : public SampleSource {
 public:
  explicit Samples(std::vector<Ids> s) : s_(std::move(s)) {}
  int64_t size() const override { return static_cast<int64_t>(s_.size()); }
  int64_t seq_length() const override { return static_cast<int64_t>(s_[0].size()) - 1; }
  void sample(int64_t i, int64_t* out) const override {
    std::copy(s_[static_cast<size_t>(i)].begin(), s_[static_cast<size_t>(i)].end(), out);
  }

 private:
  std::vector<Ids> s_;
};

TEST(FimDataset, EachSampleDrawsFromItsOwnSeed) {
  const std::string dir = testing::scratch_dir("fim_source");
  const HuggingFaceTokenizer tok(write_tokenizer(dir));
  FimConfig c;
  c.rate = 1.0;
  const FimTokens t = fim_tokens(c, tok);
  std::vector<Ids> raw;
  for (const std::string& doc : documents()) {
    Ids ids = tok.encode(doc);
    ids.resize(40, t.eod);
    raw.push_back(ids);
  }
  const FimSampleSource train(std::make_unique<Samples>(raw), c, t, tok, 1234, 0);
  const FimSampleSource valid(std::make_unique<Samples>(raw), c, t, tok, 1234, 1);
  EXPECT_EQ(train.size(), static_cast<int64_t>(raw.size()));
  EXPECT_EQ(train.seq_length(), 39);
  int differ = 0;
  std::vector<Ids> first(raw.size(), Ids(40));
  for (int64_t i = 0; i < train.size(); ++i) {
    train.sample(i, first[static_cast<size_t>(i)].data());
    NumpyRandomState rng(fim_sample_seed(1234, 0, i));
    EXPECT_EQ(first[static_cast<size_t>(i)],
              fim_sample(raw[static_cast<size_t>(i)], c, t, tok, rng));
    Ids other(40);
    valid.sample(i, other.data());
    differ += other != first[static_cast<size_t>(i)];
  }
  EXPECT_GT(differ, train.size() / 2);  // the validation stream draws other boundaries
  // Any order and any thread reads the same samples (no shared random stream).
  std::vector<Ids> again(raw.size(), Ids(40));
  std::thread a([&] {
    for (int64_t i = train.size() - 1; i >= 0; i -= 2)
      train.sample(i, again[static_cast<size_t>(i)].data());
  });
  for (int64_t i = train.size() - 2; i >= 0; i -= 2)
    train.sample(i, again[static_cast<size_t>(i)].data());
  a.join();
  EXPECT_EQ(again, first);
  // Pinned (SplitMix64 computed independently in Python): these seeds decide every FIM sample,
  // so changing them changes what a run resumed from an older checkpoint reads.
  EXPECT_EQ(fim_sample_seed(1234, 0, 0), 1905634530u);
  EXPECT_EQ(fim_sample_seed(1234, 0, 1), 4238040815u);
  EXPECT_EQ(fim_sample_seed(1234, 1, 0), 1496693619u);
  EXPECT_EQ(fim_sample_seed(7, 2, 123456789), 3332407531u);
}

TEST(FimDataset, RefusesBadFlags) {
  const std::string dir = testing::scratch_dir("fim_refusals");
  const HuggingFaceTokenizer tok(write_tokenizer(dir));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  FimConfig c;
  c.rate = 1.5;
  EXPECT_NE(message([&] { validate_fim_config(c); }).find("--fim-rate 1.5"), std::string::npos);
  c.rate = 0.5;
  c.spm_rate = -0.1;
  EXPECT_NE(message([&] { validate_fim_config(c); }).find("--fim-spm-rate"), std::string::npos);
  c.spm_rate = 0.5;
  c.split_sample = "<file_sep>";
  EXPECT_NE(message([&] { validate_fim_config(c); }).find("--fim-fragment-rate"),
            std::string::npos);
  c.fragment_rate = 0.5;
  EXPECT_EQ(message([&] { validate_fim_config(c); }), "(no error)");
  c.middle_token = "<nowhere>";
  const std::string m = message([&] { fim_tokens(c, tok); });
  EXPECT_NE(m.find("--fim-middle-token <nowhere> is no token of the tokenizer"), std::string::npos)
      << m;
}

}  // namespace
}  // namespace megatron
