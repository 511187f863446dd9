// Shared helpers of the GPT dataset tests: the NumPy oracle runner, exact array comparison,
// and an in-memory corpus.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/index_cache.h"
#include "data/indexed_dataset.h"
#include "data/numpy_random.h"
#include "testing/testing.h"

namespace megatron::gpt_testing {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// Runs the oracle on `cases`; its outputs land in `dir`.
inline void run_oracle(const Json& cases, const std::string& dir) {
  const std::string spec = dir + "/spec.json";
  std::ofstream(spec) << cases.dump();
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_INDICES_ORACLE +
                          " --spec " + spec + " --out " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// `f` must throw InvalidArgument whose message names `needle` (a flag, usually).
inline void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

inline Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

// Same dtype, shape and values; names the first difference.
inline ::testing::AssertionResult same_array(const NpyArray& got, const NpyArray& want) {
  if (got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure()
           << "dtype " << npy_dtype_name(got.dtype()) << " vs " << npy_dtype_name(want.dtype());
  }
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << "shapes differ";
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.get(i) != want.get(i)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got.get(i) << " vs " << want.get(i);
    }
  }
  return ::testing::AssertionSuccess();
}

inline NpyArray to_npy(const std::vector<int32_t>& v) {
  NpyArray a(NpyDType::kInt32, {static_cast<int64_t>(v.size())});
  std::ranges::copy(v, a.mutable_values<int32_t>().begin());
  return a;
}

inline NpyArray to_npy(const std::vector<int64_t>& v) {
  NpyArray a(NpyDType::kInt64, {static_cast<int64_t>(v.size())});
  std::ranges::copy(v, a.mutable_values<int64_t>().begin());
  return a;
}

// Documents held in memory: lengths and the concatenated token stream.
struct Corpus {
  std::vector<int32_t> lengths;
  std::vector<int64_t> tokens;
  std::vector<int64_t> starts;  // prefix sums of lengths

  Corpus(int64_t docs, int32_t min_len, int32_t max_len, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int32_t> len(min_len, max_len);
    std::uniform_int_distribution<int64_t> tok(0, 65000);
    starts.push_back(0);
    for (int64_t d = 0; d < docs; ++d) {
      lengths.push_back(len(gen));
      for (int32_t t = 0; t < lengths.back(); ++t) tokens.push_back(tok(gen));
      starts.push_back(starts.back() + lengths.back());
    }
  }
  ReadTokens reader() const {
    return [this](int64_t seq, int64_t offset, int64_t length, int64_t* out) {
      std::copy_n(tokens.begin() + starts[static_cast<size_t>(seq)] + offset, length, out);
    };
  }
  // Writes lengths and tokens as .npy (with our writer) for the oracle; returns their paths.
  std::pair<std::string, std::string> save(const std::string& dir, const std::string& name) const {
    const std::string l = dir + "/" + name + ".lengths.npy", t = dir + "/" + name + ".tokens.npy";
    to_npy(lengths).save(l);
    to_npy(tokens).save(t);
    return {l, t};
  }
};

}  // namespace megatron::gpt_testing
