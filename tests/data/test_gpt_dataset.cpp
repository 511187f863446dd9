// GPT dataset indices, blending and their caches against an independent NumPy oracle.
//
// tests/data/megatron_indices.py re-implements Megatron's algorithms with NumPy (its
// RandomState is the real one). Each test writes a list of cases, runs the oracle, and compares
// what it wrote with what our code builds. Every comparison is exact: these are integer indices
// and token ids, and the only floating point involved (split fractions, normalised blend
// weights, the single-precision sample count) is reproduced operation for operation.
#include "gpt_dataset_testing.h"

namespace megatron {
namespace {

using namespace gpt_testing;
namespace fs = std::filesystem;

// ---- NumPy's RandomState ---------------------------------------------------------------------

TEST(NumpyRandomState, ShuffleMatchesNumPy) {
  const std::string dir = testing::scratch_dir("gpt_shuffle");
  const std::vector<int64_t> sizes = {
      0,   1,   2,   3,    5,    7,     8,     16,    17,           100,
      255, 256, 257, 1000, 4097, 65535, 65536, 65537, (1 << 20) + 3};
  const std::vector<int64_t> seeds = {0, 1, 1234, 2147483648LL, 4294967295LL};
  Json cases = Json::array();
  for (const char* dtype : {"int32", "uint32", "int64"}) {
    for (int64_t seed : seeds) {
      // One RandomState shuffles every size in turn, so the stream continuation is checked too.
      cases.push_back({{"op", "shuffle"},
                       {"name", std::string(dtype) + "_" + std::to_string(seed)},
                       {"seed", seed},
                       {"dtype", dtype},
                       {"sizes", sizes}});
    }
  }
  run_oracle(cases, dir);
  for (const Json& c : cases) {
    const NpyArray want = NpyArray::load(dir + "/" + c["name"].get<std::string>() + ".npy");
    NumpyRandomState rng(static_cast<uint32_t>(c["seed"].get<int64_t>()));
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    NpyArray got(want.dtype(), {total});
    auto fill = [&]<typename T>(std::span<T> all) {
      size_t at = 0;
      for (int64_t n : sizes) {
        std::span<T> part = all.subspan(at, static_cast<size_t>(n));
        for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<T>(i);
        rng.shuffle(part);
        at += part.size();
      }
    };
    if (want.dtype() == NpyDType::kInt32) fill(got.mutable_values<int32_t>());
    if (want.dtype() == NpyDType::kUInt32) fill(got.mutable_values<uint32_t>());
    if (want.dtype() == NpyDType::kInt64) fill(got.mutable_values<int64_t>());
    EXPECT_TRUE(same_array(got, want)) << c["name"];
  }
}

TEST(NumpyRandomState, RandomIntervalMatchesNumPyRandint) {
  // RandomState.randint(0, max + 1) draws with the same masked rejection as shuffle's bound,
  // including the two-draw 64-bit path that arrays below 2^32 elements never reach.
  const std::string dir = testing::scratch_dir("gpt_randint");
  // Bounds on both sides of 2^32, where the draws switch from one 32-bit word to two.
  const std::vector<uint64_t> maxes = {1,
                                       6,
                                       1000,
                                       0xffffffffu,
                                       1ULL << 32,
                                       (1ULL << 33) + 5,
                                       (1ULL << 40) - 1,
                                       (1ULL << 62) + 12345};  // NOLINT
  Json cases = Json::array();
  for (size_t i = 0; i < maxes.size(); ++i) {
    cases.push_back({{"op", "randint"},
                     {"name", "r" + std::to_string(i)},
                     {"seed", 42 + i},
                     {"max", maxes[i]},
                     {"count", 500}});
  }
  run_oracle(cases, dir);
  for (size_t i = 0; i < maxes.size(); ++i) {
    const NpyArray want = NpyArray::load(dir + "/r" + std::to_string(i) + ".npy");
    NumpyRandomState rng(static_cast<uint32_t>(42 + i));
    for (int64_t k = 0; k < want.numel(); ++k) {
      ASSERT_EQ(static_cast<int64_t>(rng.random_interval(maxes[i])), want.get(k))
          << "max " << maxes[i] << " draw " << k;
    }
  }
}

TEST(NumpyRandomState, BinomialOneAndRandintMatchNumPy) {
  // Fill-in-the-middle's draws (data/fim_dataset.h): binomial(1, p), including p = 0 and 1
  // (RandomState still draws), both sides of 1/2 and a p next to 0, each followed by
  // randint(0, n + 1, size=2) with n = 0 (no draw) and past 2^16.
  const std::string dir = testing::scratch_dir("gpt_binomial");
  const std::vector<double> ps = {0.5, 0.0, 1.0, 0.1, 0.9, 0.3, 0.7000000000000001, 1e-9};
  const std::vector<int64_t> ns = {0, 1, 5, 100, 70000, 3};
  Json cases = Json::array();
  for (int64_t seed : {0, 1234, 99}) {
    cases.push_back({{"op", "binomial"},
                     {"name", "b" + std::to_string(seed)},
                     {"seed", seed},
                     {"ps", ps},
                     {"ns", ns},
                     {"count", 2000}});
  }
  run_oracle(cases, dir);
  for (const Json& c : cases) {
    const NpyArray want = NpyArray::load(dir + "/" + c["name"].get<std::string>() + ".npy");
    NumpyRandomState rng(static_cast<uint32_t>(c["seed"].get<int64_t>()));
    int64_t ones = 0, at = 0;
    for (int64_t k = 0; k < 2000; ++k) {
      const double p = ps[static_cast<size_t>(k) % ps.size()];
      const int64_t n = ns[static_cast<size_t>(k) % ns.size()];
      const int64_t b = rng.binomial_one(p);
      ones += b;
      ASSERT_EQ(b, want.get(at++)) << "p " << p << " draw " << k;
      ASSERT_EQ(rng.randint(0, n + 1), want.get(at++)) << "n " << n << " draw " << k;
      ASSERT_EQ(rng.randint(0, n + 1), want.get(at++)) << "n " << n << " draw " << k;
    }
    ASSERT_EQ(at, want.numel());
    EXPECT_GT(ones, 500);  // the draws are not all zero
  }
}

// ---- .npy files ------------------------------------------------------------------------------

// Values spanning each dtype's range (negative, past 2^31, past 2^32 for int64).
int64_t pattern(NpyDType t, int64_t k) {
  const int64_t v = (k * 7919) % 65521 - 32000;
  switch (t) {
    case NpyDType::kInt16:
      return v % 30000;
    case NpyDType::kInt32:
      return v * 1000;
    case NpyDType::kInt64:
      return v * 4000000000LL;
    case NpyDType::kUInt32:
      return v + 4000000000LL;
  }
  return 0;
}

void set_element(NpyArray& a, int64_t k, int64_t v) {
  const auto i = static_cast<size_t>(k);
  switch (a.dtype()) {
    case NpyDType::kInt16:
      a.mutable_values<int16_t>()[i] = static_cast<int16_t>(v);
      break;
    case NpyDType::kInt32:
      a.mutable_values<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case NpyDType::kInt64:
      a.mutable_values<int64_t>()[i] = v;
      break;
    case NpyDType::kUInt32:
      a.mutable_values<uint32_t>()[i] = static_cast<uint32_t>(v);
      break;
  }
}

TEST(Npy, NumPyLoadsOursAndOursAreByteIdentical) {
  const std::string dir = testing::scratch_dir("gpt_npy");
  struct Case {
    NpyDType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Case> shapes = {
      {NpyDType::kInt32, {0}},    {NpyDType::kInt32, {1}},     {NpyDType::kInt32, {7}},
      {NpyDType::kInt64, {1000}}, {NpyDType::kUInt32, {33}},   {NpyDType::kInt16, {129}},
      {NpyDType::kInt32, {3, 2}}, {NpyDType::kInt64, {0, 2}},  {NpyDType::kInt32, {5000, 2}},
      {NpyDType::kInt64, {}},     {NpyDType::kInt16, {100003}}};
  Json cases = Json::array();
  std::vector<NpyArray> ours;
  for (size_t i = 0; i < shapes.size(); ++i) {
    NpyArray a(shapes[i].dtype, shapes[i].shape);
    Json values = Json::array();
    for (int64_t k = 0; k < a.numel(); ++k) {
      const int64_t v = pattern(a.dtype(), k);
      values.push_back(v);
      set_element(a, k, v);
    }
    const std::string path = dir + "/ours" + std::to_string(i) + ".npy";
    a.save(path);
    cases.push_back({{"op", "npy_check"},
                     {"name", "c" + std::to_string(i)},
                     {"path", path},
                     {"dtype", npy_dtype_name(a.dtype())},
                     {"shape", a.shape()},
                     {"values", values}});
    ours.push_back(std::move(a));
  }
  run_oracle(cases, dir);
  for (size_t i = 0; i < ours.size(); ++i) {
    const Json facts = read_json(dir + "/c" + std::to_string(i) + ".json");
    EXPECT_TRUE(facts["loads"].get<bool>()) << "case " << i;
    EXPECT_TRUE(facts["same_bytes"].get<bool>()) << "case " << i;
    // And what numpy.save wrote loads in ours with the same content.
    const NpyArray theirs = NpyArray::load(dir + "/c" + std::to_string(i) + ".numpy.npy");
    EXPECT_TRUE(same_array(theirs, ours[i])) << "case " << i;
  }
}

TEST(Npy, RejectsBrokenFiles) {
  const std::string dir = testing::scratch_dir("gpt_npy_broken");
  NpyArray a(NpyDType::kInt32, {100});
  a.save(dir + "/good.npy");
  const auto good_size = fs::file_size(dir + "/good.npy");
  auto variant = [&](const std::string& name, auto edit) {
    fs::copy_file(dir + "/good.npy", dir + "/" + name);
    edit(dir + "/" + name);
    EXPECT_THROW(NpyArray::load(dir + "/" + name), InvalidArgument) << name;
  };
  variant("truncated.npy", [&](const std::string& p) { fs::resize_file(p, good_size - 4); });
  variant("header_only.npy", [&](const std::string& p) { fs::resize_file(p, 40); });
  variant("longer.npy", [&](const std::string& p) { fs::resize_file(p, good_size + 4); });
  variant("empty.npy", [&](const std::string& p) { fs::resize_file(p, 0); });
  auto patch = [](const std::string& p, size_t at, const std::string& bytes) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  variant("magic.npy", [&](const std::string& p) { patch(p, 1, "X"); });
  variant("float.npy", [&](const std::string& p) { patch(p, 20, "f4"); });  // '<i4' -> '<f4'
  variant("fortran.npy", [&](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), {});
    const size_t at = s.find("False");
    in.close();
    patch(p, at, "True ");
  });
  EXPECT_NO_THROW(NpyArray::load(dir + "/good.npy"));
}

// ---- splits ----------------------------------------------------------------------------------

TEST(Split, DocumentRangesMatchMegatron) {
  const std::string dir = testing::scratch_dir("gpt_split");
  const std::vector<std::string> splits = {"969,30,1",    "969, 30, 1", "99,1,0",   "1,1,1",
                                           "0,1,0",       "90,5,5",     "1",        "2.5,0.5",
                                           "0.5,.25,.25", "1,1",        "949,50,1", "98,2"};
  const std::vector<int64_t> docs = {1, 2, 5, 17, 50, 999, 1000, 2001, 123457};
  Json cases = Json::array();
  for (size_t i = 0; i < splits.size(); ++i) {
    for (size_t j = 0; j < docs.size(); ++j) {
      cases.push_back({{"op", "split"},
                       {"name", "s" + std::to_string(i) + "_" + std::to_string(j)},
                       {"split", splits[i]},
                       {"num_docs", docs[j]}});
    }
  }
  run_oracle(cases, dir);
  for (size_t i = 0; i < splits.size(); ++i) {
    for (size_t j = 0; j < docs.size(); ++j) {
      const Json want =
          read_json(dir + "/s" + std::to_string(i) + "_" + std::to_string(j) + ".json");
      const auto got = split_document_ranges(splits[i], docs[j]);
      for (size_t k = 0; k < 3; ++k) {
        const Json& w = want["ranges"][k];
        ASSERT_EQ(got[k].has_value(), !w.is_null())
            << splits[i] << " n=" << docs[j] << " split " << k;
        if (!got[k]) continue;
        EXPECT_EQ(got[k]->begin, w[0].get<int64_t>()) << splits[i] << " n=" << docs[j];
        EXPECT_EQ(got[k]->end, w[1].get<int64_t>()) << splits[i] << " n=" << docs[j];
      }
    }
  }
}

TEST(Split, BadSplitsNameTheFlag) {
  for (const char* bad : {"1,2,3,4", "0,0,0", "abc", "1..2,1", ""}) {
    expect_error_naming([&] { parse_split(bad); }, "--split");
  }
}

// ---- GPT indices -----------------------------------------------------------------------------

struct GPTCase {
  const Corpus* corpus;
  DocumentRange docs;
  std::optional<int64_t> num_samples;
  int64_t seq_length;
  int64_t seed;
  Split split;
  bool drop_last = true;
};

TEST(GPTIndices, MatchOracleAndFetchMatchesTokenStream) {
  const std::string dir = testing::scratch_dir("gpt_indices");
  const Corpus a(300, 1, 200, 1), b(120, 0, 40, 2), c(40, 1, 5000, 3);
  const std::vector<std::pair<const Corpus*, std::string>> corpora = {
      {&a, "a"}, {&b, "b"}, {&c, "c"}};
  std::map<const Corpus*, std::pair<std::string, std::string>> files;
  for (const auto& [corpus, name] : corpora) files[corpus] = corpus->save(dir, name);

  // Request counts around epoch boundaries: one epoch plus 2 samples (final epoch far below 80%:
  // shuffled separately) and plus 90% of an epoch (not separate).
  auto per_epoch = [](const Corpus& k, DocumentRange r, int64_t s) {
    int64_t t = 0;
    for (int64_t d = r.begin; d < r.end; ++d) t += k.lengths[static_cast<size_t>(d)];
    return (t - 1) / s;
  };
  const DocumentRange a_train{0, 290}, a_small{290, 299};
  std::vector<GPTCase> cases = {
      {&a, a_train, 100, 16, 1234, Split::kTrain},
      {&a, a_train, per_epoch(a, a_train, 16) + 2, 16, 1234, Split::kTrain},
      {&a, a_train, per_epoch(a, a_train, 16) * 19 / 10, 16, 5, Split::kTrain},
      {&a, a_train, per_epoch(a, a_train, 32) * 3 + 1, 32, 77, Split::kTrain},
      {&a, a_small, 500, 64, 1234, Split::kValid},
      {&a, {0, 300}, 0, 2, 1234, Split::kTrain},
      {&a, {0, 300}, 1000, 31, 99, Split::kTest},
      {&b, {0, 120}, std::nullopt, 8, 7, Split::kValid, false},
      {&b, {10, 100}, 300, 8, 0, Split::kValid, false},
      {&b, {0, 120}, 1000, 8, 3, Split::kTrain},
      {&c, {0, 40}, 2000, 128, 4294967295LL, Split::kTrain},
      {&c, {5, 6}, 100, 16, 1, Split::kTest},
  };
  Json spec = Json::array();
  for (size_t i = 0; i < cases.size(); ++i) {
    const GPTCase& k = cases[i];
    spec.push_back({{"op", "gpt"},
                    {"name", "g" + std::to_string(i)},
                    {"lengths", files[k.corpus].first},
                    {"tokens", files[k.corpus].second},
                    {"begin", k.docs.begin},
                    {"end", k.docs.end},
                    {"num_samples", k.num_samples ? Json(*k.num_samples) : Json(nullptr)},
                    {"seq_length", k.seq_length},
                    {"seed", k.seed},
                    {"split", split_name(k.split)},
                    {"drop_last_partial_validation_sequence", k.drop_last}});
  }
  run_oracle(spec, dir);

  bool saw_separate = false, saw_joint_multi_epoch = false, saw_padding = false;
  bool multi_part = false;
  for (size_t i = 0; i < cases.size(); ++i) {
    const GPTCase& k = cases[i];
    const std::string base = dir + "/g" + std::to_string(i);
    SCOPED_TRACE("case " + std::to_string(i));
    const GPTIndexPlan plan =
        plan_gpt_indices(k.corpus->lengths, k.docs, k.num_samples, k.seq_length, k.drop_last);
    const Json facts = read_json(base + ".json");
    EXPECT_EQ(plan.num_epochs, facts["num_epochs"].get<int64_t>());
    EXPECT_EQ(plan.num_samples, facts["num_samples"].get<int64_t>());
    EXPECT_EQ(plan.tokens_per_epoch, facts["tokens_per_epoch"].get<int64_t>());
    EXPECT_EQ(plan.separate_final_epoch, facts["separate_final_epoch"].get<bool>());
    saw_separate |= plan.separate_final_epoch;
    saw_joint_multi_epoch |= plan.num_epochs > 1 && !plan.separate_final_epoch;

    const GPTIndices ours = build_gpt_indices(k.corpus->lengths, k.docs, plan, k.seq_length,
                                              static_cast<uint32_t>(k.seed));
    EXPECT_TRUE(same_array(ours.document_index, NpyArray::load(base + ".document_index.npy")));
    EXPECT_TRUE(same_array(ours.sample_index, NpyArray::load(base + ".sample_index.npy")));
    EXPECT_TRUE(same_array(ours.shuffle_index, NpyArray::load(base + ".shuffle_index.npy")));
    // What we build must pass the check a cache has to pass, or caches would never be reused.
    EXPECT_EQ(check_gpt_indices(ours, k.corpus->lengths, k.docs), "");

    const NpyArray want = NpyArray::load(base + ".samples.npy");
    ASSERT_EQ(want.shape(), (std::vector<int64_t>{plan.num_samples, k.seq_length + 1}));
    // The parts each sample is cut from (what GPTDataset::document_lengths reports, and
    // --dataloader-inter-document-masking masks by): the oracle's pieces, in order.
    const NpyArray want_parts = NpyArray::load(base + ".document_lengths.npy");
    ASSERT_EQ(want_parts.shape().size(), 2u);
    ASSERT_EQ(want_parts.shape()[0], plan.num_samples);
    const int64_t max_parts = want_parts.shape()[1];
    std::vector<int64_t> got(static_cast<size_t>(k.seq_length + 1));
    for (int64_t s = 0; s < plan.num_samples; ++s) {
      std::vector<int64_t> parts;
      const ReadTokens read = k.corpus->reader();
      fetch_gpt_sample(
          ours, k.corpus->lengths, k.seq_length, -1, s,
          [&](int64_t seq, int64_t offset, int64_t length, int64_t* dst) {
            parts.push_back(length);
            read(seq, offset, length, dst);
          },
          got.data());
      for (int64_t p = 0; p < max_parts; ++p) {
        const int64_t w = want_parts.get(s * max_parts + p);
        if (w == 0) break;  // the zero fill (the corpora hold no empty documents)
        ASSERT_LT(static_cast<size_t>(p), parts.size()) << "sample " << s;
        EXPECT_EQ(parts[static_cast<size_t>(p)], w) << "sample " << s << " part " << p;
      }
      multi_part |= parts.size() > 1;
      for (int64_t t = 0; t <= k.seq_length; ++t) {
        ASSERT_EQ(got[static_cast<size_t>(t)], want.get(s * (k.seq_length + 1) + t))
            << "sample " << s << " token " << t;
        saw_padding |= got[static_cast<size_t>(t)] == -1;
      }
    }
  }
  // The cases must cover both final-epoch rules and a padded partial sample.
  EXPECT_TRUE(saw_separate);
  EXPECT_TRUE(saw_joint_multi_epoch);
  EXPECT_TRUE(saw_padding);
  EXPECT_TRUE(multi_part);
}

TEST(GPTIndices, WideDtypesHoldTheSameValues) {
  // Past 2^31 document-index entries the sample index is int64, and past 2^32 - 2 samples the
  // shuffle index is: too large to build here, so force the wide dtypes on a small plan and check
  // they hold exactly what the narrow ones do (Megatron's two builds differ only in type).
  const Corpus corpus(50, 1, 60, 41);
  GPTIndexPlan plan = plan_gpt_indices(corpus.lengths, {0, 50}, 400, 16, true);
  ASSERT_GT(plan.num_epochs, 1);
  const GPTIndices narrow = build_gpt_indices(corpus.lengths, {0, 50}, plan, 16, 1234);
  plan.sample_index_dtype = NpyDType::kInt64;
  plan.shuffle_index_dtype = NpyDType::kInt64;
  const GPTIndices wide = build_gpt_indices(corpus.lengths, {0, 50}, plan, 16, 1234);
  ASSERT_EQ(wide.sample_index.dtype(), NpyDType::kInt64);
  ASSERT_EQ(wide.shuffle_index.dtype(), NpyDType::kInt64);
  ASSERT_EQ(wide.sample_index.numel(), narrow.sample_index.numel());
  for (int64_t i = 0; i < wide.sample_index.numel(); ++i) {
    ASSERT_EQ(wide.sample_index.get(i), narrow.sample_index.get(i)) << i;
  }
  for (int64_t i = 0; i < wide.shuffle_index.numel(); ++i) {
    ASSERT_EQ(wide.shuffle_index.get(i), narrow.shuffle_index.get(i)) << i;
  }
  EXPECT_EQ(check_gpt_indices(wide, corpus.lengths, {0, 50}), "");
}

TEST(GPTIndices, TooFewTokensIsAnError) {
  const std::vector<int32_t> lengths = {1, 0, 1};
  EXPECT_THROW(plan_gpt_indices(lengths, {0, 2}, 10, 4, true), InvalidArgument);
  EXPECT_THROW(plan_gpt_indices(lengths, {1, 1}, 10, 4, true), InvalidArgument);
  EXPECT_NO_THROW(plan_gpt_indices(lengths, {0, 3}, 10, 4, true));
}

// ---- blending --------------------------------------------------------------------------------

TEST(Blending, MatchesOracle) {
  const std::string dir = testing::scratch_dir("gpt_blend");
  const std::vector<std::vector<double>> weights = {
      {0.3, 0.7},
      {1, 2, 3},
      {0.5, 0.25, 0.25},
      {1, 1},
      {1e-5, 1},
      {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.1},  // 10: NumPy's pairwise-sum branch
      {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4}};
  const std::vector<int64_t> sizes = {1, 1000, 12345};
  Json spec = Json::array();
  for (size_t i = 0; i < weights.size(); ++i) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      spec.push_back({{"op", "blend"},
                      {"name", "b" + std::to_string(i) + "_" + std::to_string(j)},
                      {"weights", weights[i]},
                      {"size", sizes[j]}});
    }
  }
  run_oracle(spec, dir);
  for (size_t i = 0; i < weights.size(); ++i) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      const std::string base = dir + "/b" + std::to_string(i) + "_" + std::to_string(j);
      SCOPED_TRACE(base);
      const std::vector<double> w = normalize_weights(weights[i]);
      const Json facts = read_json(base + ".json");
      for (size_t k = 0; k < w.size(); ++k) {
        EXPECT_EQ(w[k], facts["weights"][k].get<double>()) << "weight " << k;  // bit-exact
      }
      NpyArray di(NpyDType::kInt16, {sizes[j]}), dsi(NpyDType::kInt64, {sizes[j]});
      build_blending_indices(w, di.mutable_values<int16_t>(), dsi.mutable_values<int64_t>());
      EXPECT_TRUE(same_array(di, NpyArray::load(base + ".dataset_index.npy")));
      EXPECT_TRUE(same_array(dsi, NpyArray::load(base + ".dataset_sample_index.npy")));
    }
  }
}

TEST(Blending, ExhaustiveMatchesOracle) {
  // --full-validation's blend of several prefixes: no size, every sample of each dataset once.
  const std::string dir = testing::scratch_dir("gpt_exhaustive_blend");
  const std::vector<std::vector<int64_t>> sizes = {
      {1}, {3, 5}, {100, 1, 37}, {0, 4, 4}, {1000, 999, 17, 250}};
  Json spec = Json::array();
  for (size_t i = 0; i < sizes.size(); ++i)
    spec.push_back(
        {{"op", "exhaustive_blend"}, {"name", "e" + std::to_string(i)}, {"sizes", sizes[i]}});
  run_oracle(spec, dir);
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("e" + std::to_string(i));
    int64_t total = 0;
    for (int64_t n : sizes[i]) total += n;
    NpyArray di(NpyDType::kInt16, {total}), dsi(NpyDType::kInt64, {total});
    build_exhaustive_blending_indices(sizes[i], di.mutable_values<int16_t>(),
                                      dsi.mutable_values<int64_t>());
    const std::string base = dir + "/e" + std::to_string(i);
    EXPECT_TRUE(same_array(di, NpyArray::load(base + ".dataset_index.npy")));
    EXPECT_TRUE(same_array(dsi, NpyArray::load(base + ".dataset_sample_index.npy")));
  }
}

// ---- descriptions ----------------------------------------------------------------------------

TEST(Descriptions, TextAndMd5MatchMegatron) {
  const std::string dir = testing::scratch_dir("gpt_description");
  const Json tokenizer = {
      {"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
      {"tokenizer_path", "gpt2"},
      {"vocab_file", "data/gpt2-vocab.json"}};
  struct Case {
    std::string path;
    std::optional<int64_t> num_samples;
    Split split;
    int64_t seed, seq;
    std::optional<std::string> split_string;
  };
  const std::vector<Case> cases = {
      {"data/my-gpt2_text_document", 3840000, Split::kTrain, 1234, 2048, "969, 30, 1"},
      {"data/x", std::nullopt, Split::kValid, 0, 16, "99,1,0"},
      {"data/x", 10, Split::kTest, 4294967295LL, 1, "0,1,0"},
      {"data/caf\xc3\xa9", 10, Split::kTest, 7, 8, "1"},
      {"data/y", 77, Split::kValid, 1, 512, std::nullopt},
  };
  Json spec = Json::array();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    spec.push_back({{"op", "gpt_description"},
                    {"name", "d" + std::to_string(i)},
                    {"dataset_path", c.path},
                    {"num_samples", c.num_samples ? Json(*c.num_samples) : Json(nullptr)},
                    {"index_split", split_name(c.split)},
                    {"seed", c.seed},
                    {"seq_length", c.seq},
                    {"split", c.split_string ? Json(*c.split_string) : Json(nullptr)},
                    {"tokenizer", tokenizer}});
  }
  const std::vector<std::vector<double>> blend_weights = {
      {0.1, 0.2, 0.7}, {1e-5, 1, 1}, {1, 1, 1}, {3, 0.25, 1e-3}};
  for (size_t i = 0; i < blend_weights.size(); ++i) {
    spec.push_back({{"op", "blended_description"},
                    {"name", "bd" + std::to_string(i)},
                    {"datasets", Json::array({{{"dataset_path", "p1"}, {"num_samples", 101}},
                                              {{"dataset_path", "p2"}, {"num_samples", 57}},
                                              {{"dataset_path", "p3"}, {"num_samples", 3}}})},
                    {"index_split", "train"},
                    {"seed", 1234},
                    {"seq_length", 64},
                    {"split", "969, 30, 1"},
                    {"tokenizer", tokenizer},
                    {"weights", blend_weights[i]},
                    {"size", 1000}});
  }
  // Exhaustive (--full-validation): the weights are the datasets' sizes, the size null.
  spec.push_back({{"op", "blended_description"},
                  {"name", "bd_exhaustive"},
                  {"datasets", Json::array({{{"dataset_path", "p1"}, {"num_samples", nullptr}},
                                            {{"dataset_path", "p2"}, {"num_samples", nullptr}}})},
                  {"index_split", "valid"},
                  {"seed", 1234},
                  {"seq_length", 64},
                  {"split", "969, 30, 1"},
                  {"tokenizer", tokenizer},
                  {"weights", {101, 57}},
                  {"size", nullptr}});
  run_oracle(spec, dir);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    GPTDatasetConfig config;
    config.random_seed = c.seed;
    config.sequence_length = c.seq;
    config.split = c.split_string;
    config.tokenizer_json = tokenizer.dump();
    const std::string ours = gpt_dataset_description(c.path, c.num_samples, c.split, config);
    const Json want = read_json(dir + "/d" + std::to_string(i) + ".json");
    EXPECT_EQ(ours, want["text"].get<std::string>());
    EXPECT_EQ(md5_hex(ours), want["md5"].get<std::string>());
  }
  // The blends' datasets: seed 1234, sequence 64, the legacy split.
  GPTDatasetConfig blend_config;
  blend_config.random_seed = 1234;
  blend_config.sequence_length = 64;
  blend_config.split = "969, 30, 1";
  blend_config.tokenizer_json = tokenizer.dump();
  for (size_t i = 0; i < blend_weights.size(); ++i) {
    const GPTDatasetConfig& config = blend_config;
    const std::vector<std::string> parts = {
        gpt_dataset_description("p1", 101, Split::kTrain, config),
        gpt_dataset_description("p2", 57, Split::kTrain, config),
        gpt_dataset_description("p3", 3, Split::kTrain, config)};
    const Json want = read_json(dir + "/bd" + std::to_string(i) + ".json");
    const std::string ours = blended_dataset_description(parts, Split::kTrain,
                                                         normalize_weights(blend_weights[i]), 1000);
    EXPECT_EQ(ours, want["text"].get<std::string>());
    EXPECT_EQ(md5_hex(ours), want["md5"].get<std::string>());
  }
  {
    const std::vector<std::string> parts = {
        gpt_dataset_description("p1", std::nullopt, Split::kValid, blend_config),
        gpt_dataset_description("p2", std::nullopt, Split::kValid, blend_config)};
    const std::vector<double> sizes = {101, 57};
    const std::string ours = blended_dataset_description(parts, Split::kValid, sizes, std::nullopt);
    const Json want = read_json(dir + "/bd_exhaustive.json");
    EXPECT_EQ(ours, want["text"].get<std::string>());
    EXPECT_EQ(md5_hex(ours), want["md5"].get<std::string>());
  }
}

}  // namespace
}  // namespace megatron
