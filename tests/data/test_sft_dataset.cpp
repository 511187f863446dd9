// --sft samples against Megatron's SFTTokenizer.tokenize_conversation and SFTDataset restated in
// Python (sft_oracle.py) over a byte-level tokenizer.json it writes: every input token and
// target of each conversation (template, str.strip(), masking, truncation, EOD, padding), the
// refusals, the splits, and the micro-batch's loss mask and labels.
#include <cstdlib>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/sft_dataset.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using Json = nlohmann::json;
constexpr int64_t kSeq = 64;

std::string run_oracle() {
  const std::string dir = testing::scratch_dir("sft_oracle");
  const std::string cmd = std::string(MEGATRON_PYTHON_ORACLE) + " " + MEGATRON_SFT_ORACLE +
                          " --out " + dir + " --seq-length " + std::to_string(kSeq);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

TEST(SftDataset, SamplesEqualMegatronsRestated) {
  const std::string dir = run_oracle();
  const HuggingFaceTokenizer tokenizer(dir + "/tokenizer.json");
  auto sft = std::make_shared<const SftTokenizer>(tokenizer, "nemotron-h-aligned");
  auto conversations = std::make_shared<const std::vector<SftConversation>>(
      read_sft_conversations(dir + "/conversations.jsonl"));
  std::ifstream in(dir + "/expected.json");
  const Json want = Json::parse(in);
  ASSERT_EQ(want.size(), conversations->size());
  const auto n = static_cast<int64_t>(conversations->size());
  const SftDataset ds(conversations, 0, n, 2 * n, kSeq, sft, "conversations.jsonl");
  int refused = 0, truncated = 0;
  for (int64_t i = 0; i < n; ++i) {
    SCOPED_TRACE("conversation " + std::to_string(i + 1));
    const Json& w = want[static_cast<size_t>(i)];
    std::vector<int64_t> record(2 * kSeq);
    if (w.contains("error")) {
      EXPECT_THROW(ds.sample(i, record.data()), InvalidArgument);
      ++refused;
      continue;
    }
    ds.sample(i, record.data());
    const std::vector<int64_t> tokens(record.begin(), record.begin() + kSeq);
    const std::vector<int64_t> labels(record.begin() + kSeq, record.end());
    EXPECT_EQ(tokens, w.at("tokens").get<std::vector<int64_t>>());
    EXPECT_EQ(labels, w.at("labels").get<std::vector<int64_t>>());
    // Sample i + n is conversation i again (Megatron's idx % len(indices)).
    std::vector<int64_t> again(2 * kSeq);
    ds.sample(i + n, again.data());
    EXPECT_EQ(again, record);
    if (std::find(tokens.begin(), tokens.end(), sft->pad()) == tokens.end()) ++truncated;
  }
  EXPECT_EQ(refused, 3);
  EXPECT_GE(truncated, 1);  // the long answer
  // The micro-batch: labels -100 read as the pad id, the loss mask 0 on -100 and pad targets.
  const GPTBatch b = make_sft_batch(ds, 0, 2, sft->pad());
  for (int64_t r = 0; r < 2; ++r) {
    const Json& w = want[static_cast<size_t>(r)];
    for (int64_t t = 0; t < kSeq; ++t) {
      const int64_t target = w["labels"][static_cast<size_t>(t)].get<int64_t>();
      const bool masked = target == kSftIgnoreIndex || target == sft->pad();
      EXPECT_EQ(b.loss_mask.data<float>()[r * kSeq + t], masked ? 0.0f : 1.0f);
      EXPECT_EQ(b.labels.data<int64_t>()[r * kSeq + t], masked ? sft->pad() : target);
      EXPECT_EQ(b.positions.data<int64_t>()[r * kSeq + t], t);
    }
  }
}

TEST(SftDataset, SplitsAndRefusals) {
  const std::string dir = run_oracle();
  const HuggingFaceTokenizer tokenizer(dir + "/tokenizer.json");
  DataConfig config;
  config.sft = true;
  config.data_path = {dir + "/conversations.jsonl"};
  config.split = "75,25,0";  // 16 conversations: [0, 12) and [12, 16)
  const Datasets d = build_sft_datasets(config, tokenizer, kSeq, {40, 8, 4}, false);
  ASSERT_NE(d.train, nullptr);
  ASSERT_NE(d.valid, nullptr);
  EXPECT_EQ(d.test, nullptr);
  EXPECT_EQ(d.train->size(), 40);
  EXPECT_EQ(d.valid->size(), 8);
  std::vector<int64_t> a(2 * kSeq), b(2 * kSeq);
  d.valid->sample(0, a.data());   // conversation 13 (index 12): the long answer
  d.train->sample(12, b.data());  // 12 mod 12: conversation 1 again
  std::vector<int64_t> first(2 * kSeq);
  d.train->sample(0, first.data());
  EXPECT_EQ(b, first);
  EXPECT_NE(a, first);
  config.data_path = {"1", dir + "/conversations.jsonl"};
  EXPECT_THROW(build_sft_datasets(config, tokenizer, kSeq, {4, 0, 0}, false), InvalidArgument);
  EXPECT_THROW(SftTokenizer(tokenizer, "chatml"), InvalidArgument);
  std::ofstream(dir + "/bad.jsonl") << "{\"messages\": [{\"role\": \"user\"}]}\n";
  EXPECT_THROW(read_sft_conversations(dir + "/bad.jsonl"), InvalidArgument);
}

}  // namespace
}  // namespace megatron
