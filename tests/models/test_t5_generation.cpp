// Encoder-decoder generation (inference/seq2seq_generator.h) on tiny random T5 models, both
// forms (Megatron's default with learned positions; v1.1 with relative buckets): greedy decoding
// through the KV cache (decoder self-attention keys and values, cached cross-attention keys and
// values) equals decoding by full forward passes without caches, and equals the argmax of the
// training forward's logits over the generated sequence at every position; sampling with a seed
// gives the same tokens both ways; prompts of different lengths in one batch give what each
// gives alone.
//
// Tolerance: log-probabilities agree within 1e-4 (the cached path sums attention over the same
// keys in another order; f32 rounding is ~1e-6 on O(1) values). Token equality is exact: the
// models' logits are spread widely (init std 0.3), so no argmax is within rounding of a tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "inference/seq2seq_generator.h"
#include "testing/testing.h"

namespace megatron {
namespace {

TransformerConfig base_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.decoder_num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 12;
  c.decoder_seq_length = 10;
  c.max_position_embeddings = 16;
  c.vocab_size = 50;
  c.padded_vocab_size = 64;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.init_method_std = 0.3;
  c.finalize();
  return c;
}

TransformerConfig v11_config() {
  TransformerConfig c = base_config();
  c.normalization = Normalization::kRMSNorm;
  c.gated_gelu = true;
  c.openai_gelu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRelative;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 12;
  c.softmax_scale = 1.0;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  return c;
}

struct Model {
  T5Model model;
  ParamSet params;
  explicit Model(const TransformerConfig& c) : model(c), params(model.parameters(), DType::kF32) {
    params.initialize(99);
  }
};

inference::Seq2SeqRequest request(uint64_t seed) {
  inference::Seq2SeqRequest r;
  r.prompts = {{5, 9, 13, 2, 44, 7, 7, 30, 11}, {3, 4}, {21, 22, 23, 24, 25, 26}};
  r.tokens_to_generate = 8;
  r.sampling.top_k = 1;
  r.return_log_probs = true;
  r.seed = seed;
  return r;
}

const inference::Seq2SeqConfig kConfig{.vocab_size = 50, .start = 1, .end = -1, .pad = 0};

void expect_same(const std::vector<inference::Seq2SeqResult>& a,
                 const std::vector<inference::Seq2SeqResult>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ", prompt " << i;
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    for (size_t t = 0; t < a[i].logprobs.size(); ++t)
      EXPECT_NEAR(a[i].logprobs[t], b[i].logprobs[t], 1e-4) << what << ", prompt " << i;
  }
}

void check_form(const TransformerConfig& cfg) {
  Model m(cfg);
  const auto cached = inference::generate_seq2seq(m.model, request(0), kConfig, true);
  const auto full = inference::generate_seq2seq(m.model, request(0), kConfig, false);
  expect_same(cached, full, "greedy, cache against none");

  // The training forward over [start, generated...] predicts each generated token.
  const auto req = request(0);
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    const auto& p = req.prompts[i];
    const auto& gen = cached[i].tokens;
    ASSERT_EQ(gen.size(), 8u);
    // The model has not collapsed onto one token (the check would then prove little).
    EXPECT_GT(std::count(gen.begin(), gen.end(), gen.front()), 0);
    const auto se = static_cast<int64_t>(p.size()), sd = static_cast<int64_t>(gen.size());
    T5Inputs in;
    in.enc_tokens = Tensor::empty({1, se}, DType::kI64);
    std::copy(p.begin(), p.end(), in.enc_tokens.data<int64_t>());
    in.dec_tokens = Tensor::empty({1, sd}, DType::kI64);
    in.dec_tokens.data<int64_t>()[0] = kConfig.start;
    std::copy(gen.begin(), gen.end() - 1, in.dec_tokens.data<int64_t>() + 1);
    T5Model::Ctx ctx;
    const Tensor logits = m.model.forward_logits(in, ctx, ForwardMode{});
    for (int64_t t = 0; t < sd; ++t) {
      const float* row = logits.data<float>() + t * cfg.padded_vocab_size;
      const int64_t argmax = std::max_element(row, row + kConfig.vocab_size) - row;
      EXPECT_EQ(argmax, gen[static_cast<size_t>(t)]) << "prompt " << i << " position " << t;
    }
    // Alone, the prompt generates the same (the batch's padding is invisible).
    inference::Seq2SeqRequest one = req;
    one.prompts = {p};
    const auto alone = inference::generate_seq2seq(m.model, one, kConfig, true);
    EXPECT_EQ(alone[0].tokens, gen) << "prompt " << i << " alone";
  }
  std::set<int64_t> distinct;
  for (const auto& r : cached) distinct.insert(r.tokens.begin(), r.tokens.end());
  EXPECT_GT(distinct.size(), 3u) << "the random model generates almost one token";

  // Sampling: a seed gives the same draws with and without the cache, another seed others.
  auto sampled = request(7);
  sampled.sampling.top_k = 0;
  sampled.sampling.temperature = 1.0f;
  const auto s1 = inference::generate_seq2seq(m.model, sampled, kConfig, true);
  const auto s2 = inference::generate_seq2seq(m.model, sampled, kConfig, false);
  expect_same(s1, s2, "sampled, cache against none");
  sampled.seed = 8;
  const auto s3 = inference::generate_seq2seq(m.model, sampled, kConfig, true);
  bool differs = false;
  for (size_t i = 0; i < s1.size(); ++i) differs = differs || s1[i].tokens != s3[i].tokens;
  EXPECT_TRUE(differs) << "another seed should draw other tokens";
}

TEST(T5Generation, MegatronFormCachedEqualsFullForwards) {
  check_form(base_config());
}

TEST(T5Generation, RelativeFormCachedEqualsFullForwards) {
  check_form(v11_config());
}

TEST(T5Generation, StopsAtTheEndTokenAndRefusesBadRequests) {
  Model m(base_config());
  auto r = request(0);
  const auto free_run = inference::generate_seq2seq(m.model, r, kConfig, true);
  inference::Seq2SeqConfig c = kConfig;
  c.end = free_run[0].tokens[2];  // the third token of prompt 0 becomes the end token
  const auto stopped = inference::generate_seq2seq(m.model, r, c, true);
  const auto& t = stopped[0].tokens;
  const auto at = std::find(t.begin(), t.end(), c.end);
  ASSERT_NE(at, t.end());
  EXPECT_EQ(at + 1, t.end()) << "generation goes on after the end token";
  r.tokens_to_generate = 17;  // beyond the 16 learned positions
  EXPECT_THROW(inference::generate_seq2seq(m.model, r, kConfig, true), InvalidArgument);
  r = request(0);
  r.prompts.push_back({});
  EXPECT_THROW(inference::generate_seq2seq(m.model, r, kConfig, true), InvalidArgument);
}

}  // namespace
}  // namespace megatron
