// GPT dataset index caches (reuse, rebuild of broken or stale ones) and build_gpt_datasets end to
// end on real indexed datasets, against the NumPy oracle (see test_gpt_dataset.cpp).
#include "gpt_dataset_testing.h"

namespace megatron {
namespace {

using namespace gpt_testing;
namespace fs = std::filesystem;

// ---- caches ----------------------------------------------------------------------------------

TEST(IndexCache, ValidCacheIsReusedAndBrokenOnesAreRebuilt) {
  const std::string dir = testing::scratch_dir("gpt_cache");
  const Corpus corpus(200, 1, 100, 9);
  GPTDatasetConfig config;
  config.random_seed = 1234;
  config.sequence_length = 16;
  config.split = "969, 30, 1";
  const DocumentRange docs{0, 194};
  auto build = [&](const std::string& expect_in_log) {
    ::testing::internal::CaptureStdout();
    GPTIndices g =
        load_or_build_gpt_indices(corpus.lengths, docs, 3000, Split::kTrain, "data/c", config, dir);
    const std::string log = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(log.find(expect_in_log), std::string::npos) << log;
    return g;
  };
  const GPTIndices first = build("Build and save the GPTDataset train indices");
  EXPECT_FALSE(first.from_cache);
  IndexCache cache(dir, "GPTDataset", "train",
                   gpt_dataset_description("data/c", 3000, Split::kTrain, config));
  const std::string doc_path = cache.path("document_index.npy");
  const std::string sample_path = cache.path("sample_index.npy");
  const std::string shuffle_path = cache.path("shuffle_index.npy");
  const std::string desc_path = cache.path("description.txt");
  for (const auto& p : {doc_path, sample_path, shuffle_path, desc_path})
    ASSERT_TRUE(fs::exists(p)) << p;
  EXPECT_EQ(fs::path(doc_path).filename().string(),
            md5_hex(cache.description()) + "-GPTDataset-train-document_index.npy");

  // A valid cache is reused and not rewritten.
  const auto mtime = fs::last_write_time(sample_path);
  const GPTIndices again = build("Load the GPTDataset train indices");
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(fs::last_write_time(sample_path), mtime);
  auto same_as_first = [&](const GPTIndices& g) {
    EXPECT_TRUE(same_array(g.document_index, first.document_index));
    EXPECT_TRUE(same_array(g.sample_index, first.sample_index));
    EXPECT_TRUE(same_array(g.shuffle_index, first.shuffle_index));
  };
  same_as_first(again);

  // Each way of breaking it is noticed, rebuilt, and the rebuilt cache is then reused.
  auto breaks = [&](const std::string& what, auto damage) {
    SCOPED_TRACE(what);
    damage();
    const GPTIndices rebuilt = build("rebuilding the cached GPTDataset train indices");
    EXPECT_FALSE(rebuilt.from_cache);
    same_as_first(rebuilt);
    EXPECT_TRUE(build("Load the GPTDataset train indices").from_cache);
  };
  breaks("truncated sample index",
         [&] { fs::resize_file(sample_path, fs::file_size(sample_path) / 2); });
  breaks("garbage shuffle index", [&] { std::ofstream(shuffle_path) << "not a numpy file"; });
  breaks("document index of the wrong shape",
         [&] { NpyArray(NpyDType::kInt32, {5}).save(doc_path); });
  breaks("shuffle index out of range", [&] {
    NpyArray bad(NpyDType::kUInt32, first.shuffle_index.shape());
    for (auto& v : bad.mutable_values<uint32_t>()) v = 4000000000u;
    bad.save(shuffle_path);
  });
  breaks("sample index rows out of order", [&] {
    NpyArray bad(first.sample_index.dtype(), first.sample_index.shape());
    auto v = bad.mutable_values<int32_t>();
    std::ranges::copy(first.sample_index.values<int32_t>(), v.begin());
    std::swap(v[10], v[20]);
    bad.save(sample_path);
  });
  breaks("sample index of the wrong dtype", [&] {
    NpyArray bad(NpyDType::kInt64, first.sample_index.shape());
    bad.save(sample_path);
  });
  breaks("missing array", [&] { fs::remove(doc_path); });
  breaks("description mismatch", [&] { std::ofstream(desc_path) << "{}"; });
  // A crash between the arrays and the description leaves arrays without the commit marker.
  breaks("half-written (no description)", [&] { fs::remove(desc_path); });

  // A different configuration is a different cache, beside this one.
  config.random_seed = 4321;
  const GPTIndices other = build("Build and save the GPTDataset train indices");
  EXPECT_FALSE(other.from_cache);
  EXPECT_TRUE(fs::exists(desc_path));
}

TEST(IndexCache, BlendedCacheIsReusedAndRebuilt) {
  const std::string dir = testing::scratch_dir("gpt_blend_cache");
  const std::vector<std::string> descriptions = {"{\"a\": 1}", "{\"b\": 2}"};
  const std::vector<int64_t> sizes = {400, 800};
  const std::vector<double> weights = {1, 2};
  auto build = [&] {
    return load_or_build_blending_indices(descriptions, sizes, weights, 1000, Split::kTrain, dir,
                                          false);
  };
  const BlendedIndices first = build();
  EXPECT_FALSE(first.from_cache);
  const BlendedIndices again = build();
  EXPECT_TRUE(again.from_cache);
  EXPECT_TRUE(same_array(again.dataset_sample_index, first.dataset_sample_index));
  IndexCache cache(
      dir, "BlendedDataset", "train",
      blended_dataset_description(descriptions, Split::kTrain, normalize_weights(weights), 1000));
  const std::string path = cache.path("dataset_sample_index.npy");
  ASSERT_TRUE(fs::exists(path));
  fs::resize_file(path, fs::file_size(path) - 8);
  EXPECT_FALSE(build().from_cache);
  NpyArray bad(NpyDType::kInt64, {1000});  // right shape, but not the running counts
  bad.save(path);
  EXPECT_FALSE(build().from_cache);
  EXPECT_TRUE(build().from_cache);
  // A blend that draws more from a dataset than it holds is an error naming the fix.
  const std::vector<int64_t> small = {400, 10};
  expect_error_naming(
      [&] {
        load_or_build_blending_indices(descriptions, small, weights, 1000, Split::kTrain, "",
                                       false);
      },
      "--mid-level-dataset-surplus");
}

// ---- the builder, end to end, on real indexed datasets --------------------------------------

// Writes corpus as an indexed dataset at `prefix` (one sequence per document).
void write_indexed(const Corpus& corpus, const std::string& prefix) {
  IndexedDatasetBuilder builder(prefix + ".bin", IndexDType::kUInt16);
  for (size_t d = 0; d < corpus.lengths.size(); ++d) {
    builder.add_item(std::span<const int64_t>(corpus.tokens.data() + corpus.starts[d],
                                              static_cast<size_t>(corpus.lengths[d])));
    builder.end_document();
  }
  builder.finalize(prefix + ".idx");
}

void expect_samples(const SampleSource* got, const std::string& want_path) {
  if (!fs::exists(want_path)) {
    EXPECT_EQ(got, nullptr) << want_path;
    return;
  }
  ASSERT_NE(got, nullptr) << want_path;
  const NpyArray want = NpyArray::load(want_path);
  ASSERT_EQ(want.shape()[0], got->size()) << want_path;
  const int64_t width = got->seq_length() + 1;
  ASSERT_EQ(want.shape()[1], width);
  std::vector<int64_t> s(static_cast<size_t>(width));
  for (int64_t i = 0; i < got->size(); ++i) {
    got->sample(i, s.data());
    for (int64_t t = 0; t < width; ++t) {
      ASSERT_EQ(s[static_cast<size_t>(t)], want.get(i * width + t))
          << want_path << " sample " << i << " token " << t;
    }
  }
}

TEST(BuildGPTDatasets, SinglePrefixAndBlendsMatchOracle) {
  const std::string dir = testing::scratch_dir("gpt_build");
  const Corpus c0(400, 1, 300, 11), c1(150, 5, 90, 12), c2(60, 1, 2000, 13);
  const std::vector<const Corpus*> corpora = {&c0, &c1, &c2};
  Json sources = Json::array();
  std::vector<std::string> prefixes;
  for (size_t i = 0; i < corpora.size(); ++i) {
    prefixes.push_back(dir + "/corpus" + std::to_string(i) + "_text_document");
    write_indexed(*corpora[i], prefixes.back());
    const auto [l, t] = corpora[i]->save(dir, "corpus" + std::to_string(i));
    sources.push_back({{"lengths", l}, {"tokens", t}});
  }
  const int64_t seq = 32, seed = 1234;
  const std::array<int64_t, 3> counts = megatron_split_num_samples(50, 16, 20, 2);
  EXPECT_EQ(counts, (std::array<int64_t, 3>{800, 96, 32}));

  struct Run {
    std::string name;
    std::vector<std::string> data_path;
    Json weights;  // for the oracle
    std::optional<std::string> split;
    std::array<int64_t, 3> counts;
  };
  const std::vector<Run> runs = {
      // One prefix, Megatron's legacy default split, default cache dir; 3 epochs of valid.
      {"single", {prefixes[0]}, nullptr, std::nullopt, counts},
      // Weighted blend of three, as one flag value.
      {"weighted",
       {"0.3 " + prefixes[0] + " 0.5 " + prefixes[1] + " 0.2 " + prefixes[2]},
       Json::array({0.3, 0.5, 0.2}),
       "90,8,2",
       {1500, 200, 100}},
      // Weighted blend of two, as separate tokens; the train part of c2 is taken ~7 times.
      {"weighted2",
       {"1", prefixes[1], "3", prefixes[2]},
       Json::array({1, 3}),
       "98,2",
       {3000, 50, 40}},
      // Unweighted: weights from dataset sizes, one epoch of each.
      {"unweighted", {prefixes[0], prefixes[1]}, nullptr, "80,10,10", {500, 50, 50}},
  };
  Json spec = Json::array();
  for (const Run& r : runs) {
    spec.push_back({{"op", "e2e"},
                    {"name", r.name},
                    {"sources", r.name == "single"       ? Json::array({sources[0]})
                                : r.name == "weighted2"  ? Json::array({sources[1], sources[2]})
                                : r.name == "unweighted" ? Json::array({sources[0], sources[1]})
                                                         : sources},
                    {"weights", r.weights},
                    {"split", r.split ? Json(*r.split) : Json(nullptr)},
                    {"num_samples", r.counts},
                    {"seq_length", seq},
                    {"seed", seed},
                    {"surplus", 0.005}});
  }
  run_oracle(spec, dir);

  for (const Run& r : runs) {
    SCOPED_TRACE(r.name);
    GPTDataArgs args;
    args.data_path = r.data_path;
    args.num_samples = r.counts;
    args.config.sequence_length = seq;
    args.config.random_seed = seed;
    args.config.split = r.split;
    args.config.log = r.name == "weighted";
    if (r.name != "single") args.config.path_to_cache = dir + "/cache_" + r.name;
    GPTDatasets ds = build_gpt_datasets(args);
    expect_samples(ds.train.get(), dir + "/" + r.name + ".train.samples.npy");
    expect_samples(ds.valid.get(), dir + "/" + r.name + ".valid.samples.npy");
    expect_samples(ds.test.get(), dir + "/" + r.name + ".test.samples.npy");
    if (r.name == "single") {
      // No --data-cache-path: Megatron's default, the prefix used as a directory.
      EXPECT_TRUE(fs::is_directory(prefixes[0] + "/cache/GPTDataset_indices"));
      auto* train = dynamic_cast<GPTDataset*>(ds.train.get());
      ASSERT_NE(train, nullptr);
      EXPECT_FALSE(train->indices().from_cache);
    }
    // A second build of the same run loads every index from the caches.
    GPTDatasets again = build_gpt_datasets(args);
    for (SampleSource* s : {again.train.get(), again.valid.get(), again.test.get()}) {
      if (auto* g = dynamic_cast<GPTDataset*>(s)) {
        EXPECT_TRUE(g->indices().from_cache);
      }
      if (auto* b = dynamic_cast<BlendedDataset*>(s)) {
        EXPECT_TRUE(b->indices().from_cache);
        for (const auto& part : b->datasets()) EXPECT_TRUE(part->indices().from_cache);
      }
    }
    expect_samples(again.train.get(), dir + "/" + r.name + ".train.samples.npy");
  }
}

TEST(BuildGPTDatasets, PerSplitPathsMatchOracle) {
  const std::string dir = testing::scratch_dir("gpt_build_per_split");
  const Corpus c0(100, 1, 300, 21), c1(80, 1, 100, 22), c2(30, 1, 50, 23);
  const std::vector<const Corpus*> corpora = {&c0, &c1, &c2};
  Json sources = Json::array();
  std::vector<std::string> prefixes;
  for (size_t i = 0; i < corpora.size(); ++i) {
    prefixes.push_back(dir + "/p" + std::to_string(i));
    write_indexed(*corpora[i], prefixes.back());
    const auto [l, t] = corpora[i]->save(dir, "p" + std::to_string(i));
    sources.push_back({{"lengths", l}, {"tokens", t}});
  }
  const std::array<int64_t, 3> counts = {700, 64, 0};
  Json per_split = Json::array({{{"sources", {0, 1}}, {"weights", {2, 1}}},
                                {{"sources", {2}}, {"weights", nullptr}},
                                nullptr});
  run_oracle(Json::array({{{"op", "e2e"},
                           {"name", "ps"},
                           {"sources", sources},
                           {"per_split", per_split},
                           {"weights", nullptr},
                           {"split", nullptr},
                           {"num_samples", counts},
                           {"seq_length", 24},
                           {"seed", 5},
                           {"surplus", 0.005}}}),
             dir);
  GPTDataArgs args;
  args.train_data_path = {"2", prefixes[0], "1", prefixes[1]};
  args.valid_data_path = {prefixes[2]};
  args.test_data_path = {prefixes[0]};  // asked for 0 samples: left out
  args.num_samples = counts;
  args.config.sequence_length = 24;
  args.config.random_seed = 5;
  args.config.path_to_cache = dir + "/cache";
  args.config.log = false;
  GPTDatasets ds = build_gpt_datasets(args);
  expect_samples(ds.train.get(), dir + "/ps.train.samples.npy");
  expect_samples(ds.valid.get(), dir + "/ps.valid.samples.npy");
  EXPECT_EQ(ds.test, nullptr);
}

TEST(BuildGPTDatasets, BadFlagsNameTheFlag) {
  const std::string dir = testing::scratch_dir("gpt_build_errors");
  const Corpus c(50, 1, 100, 31);
  write_indexed(c, dir + "/p");
  auto fails_naming = [&](GPTDataArgs args, const std::string& flag) {
    args.config.sequence_length = 8;
    args.config.log = false;
    args.config.path_to_cache = dir + "/cache";
    args.num_samples = {10, 10, 10};
    expect_error_naming([&] { build_gpt_datasets(args); }, flag);
  };
  GPTDataArgs a;
  fails_naming(a, "--data-path");
  a.data_path = {"0.5 " + dir + "/p x " + dir + "/p"};
  fails_naming(a, "--data-path");
  a.data_path = {"-1 " + dir + "/p"};
  fails_naming(a, "--data-path");
  a.data_path = {dir + "/p"};
  a.config.split = "1,2,3,4";
  fails_naming(a, "--split");
  a.config.split = std::nullopt;
  a.config.random_seed = -1;
  fails_naming(a, "--seed");
  GPTDataArgs b;
  b.data_path = {dir + "/p"};
  b.train_data_path = {dir + "/p"};
  fails_naming(b, "--train/valid/test-data-path");
  GPTDataArgs d;
  d.train_data_path = {dir + "/p"};
  d.config.split = "1,1,1";
  fails_naming(d, "--split");
  // A split without documents (50 documents, test share 0.1%) is left out, not an error.
  GPTDataArgs ok;
  ok.data_path = {dir + "/p"};
  ok.num_samples = {10, 10, 10};
  ok.config.sequence_length = 8;
  ok.config.log = false;
  ok.config.path_to_cache = dir + "/cache";
  GPTDatasets ds = build_gpt_datasets(ok);
  EXPECT_NE(ds.train, nullptr);
  EXPECT_NE(ds.valid, nullptr);
  EXPECT_EQ(ds.test, nullptr);
}

}  // namespace
}  // namespace megatron
