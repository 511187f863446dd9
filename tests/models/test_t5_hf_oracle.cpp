// The PyTorch oracle for T5: tests/reference/t5_oracle.py writes a tiny T5 with random weights in
// two forms, with a padded batch and PyTorch's logits, lm loss (pretrain_t5's masked mean) and
// the gradient of that loss for every weight:
//   hf        Hugging Face's T5ForConditionalGeneration v1.1 (relative position buckets, RMSNorm,
//             gated tanh GELU, no biases, untied head, unscaled scores), a model directory we
//             load through our importer and export back;
//   megatron  Megatron's default T5 (learned absolute positions shared by both stacks, LayerNorm,
//             erf GELU, linear biases, scores scaled by 1/sqrt(d), the head tied to the word
//             embeddings with a vocabulary bias), weights under our parameter names.
// We run T5Model + GPTLoss and must reproduce all of it.
//
// Usage: test_t5_hf_oracle ORACLE_DIR (CTest runs the Python script first, as a fixture).
//
// Tolerances (we compute in f32, the oracle in f64 rounded to f32 at the end):
// - logits: |err| <= 1e-5 + 1e-4 |x|: O(1) values from sums of h = 32 and ffn <= 64 products
//   through up to five layers; f32 rounding differences are ~1e-6.
// - loss: 1e-5 relative (a mean of a dozen O(5) terms).
// - gradients: |err| <= 1e-6 + 1e-3 |g|; a wrong term is O(|g|), far above this. The key-bias
//   rows' exact gradients are 0 (softmax ignores a per-row constant): our f32 values are noise of
//   order 1e-9, inside the absolute part.
// - relative buckets: exact, for every distance in [-1000, 1000].
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_dir.h"
#include "models/gpt/gpt_chunk.h"
#include "models/t5/t5_hf.h"
#include "testing/testing.h"
#include "transformer/relative_position.h"

namespace megatron {
namespace {

std::string g_oracle_dir;

struct Loaded {
  T5HfInfo info;
  std::unique_ptr<T5Model> model;
  std::unique_ptr<ParamSet> params;
};

void finish(TransformerConfig& c) {
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, 128);
  c.seq_length = 12;
  c.decoder_seq_length = 7;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
}

Loaded load_hf(const std::string& dir) {
  Loaded l;
  l.info = read_t5_hf_config(dir);
  TransformerConfig c = l.info.config;
  finish(c);
  l.model = std::make_unique<T5Model>(c);
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  load_t5_hf_weights(dir, l.info, *l.model, *l.params);
  return l;
}

// Megatron's default T5 from the oracle's config.json, weights by our parameter names.
Loaded load_megatron(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  Loaded l;
  TransformerConfig& c = l.info.config;
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.hidden_size = j.at("hidden_size").get<int64_t>();
  c.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
  c.kv_channels = j.at("kv_channels").get<int64_t>();
  c.ffn_hidden_size = j.at("ffn_hidden_size").get<int64_t>();
  c.num_layers = j.at("encoder_num_layers").get<int64_t>();
  c.decoder_num_layers = j.at("decoder_num_layers").get<int64_t>();
  c.max_position_embeddings = j.at("max_position_embeddings").get<int64_t>();
  c.norm_epsilon = j.at("norm_epsilon").get<double>();
  finish(c);
  l.model = std::make_unique<T5Model>(c);
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  auto st = safetensors::File::open(dir + "/model.safetensors");
  size_t found = 0;
  for (Param* p : l.params->params()) {
    EXPECT_TRUE(st.contains(p->name)) << p->name << " is not in the oracle's weights";
    if (!st.contains(p->name)) continue;
    const Tensor t = st.read(p->name);
    EXPECT_EQ(t.shape(), p->shape) << p->name;
    p->main.copy_from(t);
    ++found;
  }
  EXPECT_EQ(found, st.tensors().size()) << "the oracle has weights our model lacks";
  l.params->sync_compute_from_main();
  return l;
}

Tensor to_i32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i)
    out.data<int32_t>()[i] = static_cast<int32_t>(t.data<int64_t>()[i]);
  return out;
}

// Logits, loss and gradients; grads(model) gives ours under the oracle's names.
void check_against_oracle(const std::string& root, Loaded& l,
                          const std::function<std::map<std::string, Tensor>()>& grads) {
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  const TransformerConfig& c = l.model->config();
  const T5Inputs in{expected.read("enc_tokens"), expected.read("dec_tokens"),
                    to_i32(expected.read("enc_mask")), to_i32(expected.read("dec_mask")),
                    expected.read("labels")};
  const int64_t B = in.dec_tokens.dim(0), S = in.dec_tokens.dim(1), V = c.vocab_size;
  {  // Logits: ours [S B, Vp] (row t B + b) against PyTorch's [B, S, V].
    T5Model::Ctx ctx;
    const Tensor logits = l.model->forward_logits(in, ctx, ForwardMode{});
    Tensor got = Tensor::empty({B, S, V});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t v = 0; v < V; ++v)
          got.data<float>()[(b * S + t) * V + v] =
              logits.data<float>()[(t * B + b) * c.padded_vocab_size + v];
    EXPECT_TRUE(testing::allclose(got, expected.read("logits"), 1e-5, 1e-4)) << "logits";
  }
  // Loss and gradients through the trainer's path: T5Model -> GPTLoss.
  T5Model::Ctx ctx;
  const Tensor token_loss = l.model->forward(in, ctx, ForwardMode{});
  TensorMap batch{{"loss_mask", expected.read("loss_mask")}}, dout;
  const LossTerms terms =
      GPTLoss().forward(TensorMap{{"per-token loss", token_loss}}, batch, ObjectiveScale{}, &dout);
  const double lm = expected.read("lm_loss").item(0);
  EXPECT_NEAR(terms.at("lm loss").value(), lm, 1e-5 * lm) << "lm loss";
  l.params->zero_grads();
  l.model->backward(dout.at("per-token loss"), ctx);
  const auto ours = grads();
  ASSERT_FALSE(ours.empty());
  size_t checked = 0;
  for (const auto& [name, info] : expected.tensors()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto it = ours.find(name.substr(5));
    ASSERT_NE(it, ours.end()) << name << " has no counterpart here";
    EXPECT_TRUE(testing::allclose(it->second, expected.read(name), 1e-6, 1e-3))
        << "gradient of " << it->first;
    ++checked;
  }
  EXPECT_EQ(checked, ours.size()) << "some of our parameters have no oracle gradient";
}

TEST(T5PyTorchOracle, HuggingFaceT5v11WithRelativePositions) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  const std::string root = g_oracle_dir + "/t5-hf";
  Loaded l = load_hf(root + "/model");
  const TransformerConfig& c = l.model->config();
  EXPECT_EQ(c.position_embedding, PositionEmbedding::kRelative);
  EXPECT_EQ(c.decoder_num_layers, 3);
  check_against_oracle(root, l, [&] { return t5_hf_tensors(*l.model, true); });

  // HF's bucket function (computed in float32 there) for every distance up to 1000.
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  for (const bool bidirectional : {true, false}) {
    const Tensor want = expected.read(bidirectional ? "buckets_bidirectional" : "buckets_causal");
    ASSERT_EQ(want.numel(), 2001);
    int64_t wrong = 0;
    for (int64_t d = -1000; d <= 1000; ++d) {
      const int64_t got = relative_position_bucket(
          d, bidirectional, c.relative_attention_num_buckets, c.relative_attention_max_distance);
      wrong += got != want.data<int64_t>()[d + 1000];
    }
    EXPECT_EQ(wrong, 0) << (bidirectional ? "bidirectional" : "causal") << " buckets differ";
  }

  // Export: the same tensors, bit for bit, under the same names.
  const std::string out_dir = testing::scratch_dir("t5_hf_export");
  save_t5_hf(out_dir, l.info, *l.model);
  auto src = safetensors::SafetensorsDir::open(root + "/model");
  auto dst = safetensors::SafetensorsDir::open(out_dir);
  EXPECT_EQ(src.names(), dst.names());
  for (const std::string& name : src.names()) {
    if (!dst.contains(name)) continue;
    const Tensor a = src.read(name), b = dst.read(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name << " differs after export";
  }
  const TransformerConfig back = read_t5_hf_config(out_dir).config;
  EXPECT_EQ(back.decoder_num_layers, 3);
  EXPECT_TRUE(back.gated_gelu && back.openai_gelu);
}

TEST(T5PyTorchOracle, MegatronT5WithLearnedPositionsAndTiedHead) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  const std::string root = g_oracle_dir + "/t5-megatron";
  Loaded l = load_megatron(root + "/model");
  check_against_oracle(root, l, [&] {
    std::map<std::string, Tensor> out;
    for (Param* p : l.params->params()) out[p->name] = p->main_grad;
    return out;
  });
  // Megatron's default has no Hugging Face form.
  EXPECT_THROW(check_t5_exportable(l.model->config()), InvalidArgument);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatron::g_oracle_dir = argv[1];
  return RUN_ALL_TESTS();
}
