// The PyTorch oracle for BERT: tests/reference/bert_oracle.py writes a tiny BertForPreTraining
// (post-LN, model_type bert) and MegatronBertForPreTraining (pre-LN) with random weights as
// Hugging Face directories, with the batch (padded sequences, token types, masked-LM labels, SOP
// labels) and PyTorch's MLM logits, SOP logits, both losses (Megatron's definitions) and the
// gradient of lm loss + sop loss for every weight. We load each directory through our importer,
// run BertModel + BertLoss and must reproduce all of it; then export and compare the files.
//
// Usage: test_bert_hf_oracle ORACLE_DIR (CTest runs the Python script first, as a fixture).
//
// Tolerances (we compute in f32, the oracle in f64 rounded to f32 at the end):
// - logits: |err| <= 1e-5 + 1e-4 |x|: O(1) sums over h = 32 and ffn = 64 products through two
//   layers and the head's norm; f32 rounding differences are ~1e-6.
// - losses: 1e-5 relative (means of a few O(5) terms).
// - gradients: |err| <= 1e-6 + 1e-3 |g|. A wrong term is O(|g|), far above this. The key bias
//   gradient is zero in exact arithmetic (softmax ignores a per-row constant), so it is checked
//   against the absolute 1e-6 only: our f32 value is rounding noise around 0.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_dir.h"
#include "models/bert/bert_chunk.h"
#include "models/bert/bert_hf.h"
#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron {
namespace {

std::string g_oracle_dir;

struct Loaded {
  BertHfInfo info;
  std::unique_ptr<BertModel> model;
  std::unique_ptr<ParamSet> params;
};

Loaded load(const std::string& dir) {
  Loaded l;
  l.info = read_bert_hf_config(dir);
  TransformerConfig c = l.info.config;
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, 128);
  c.seq_length = 16;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  l.model = std::make_unique<BertModel>(c);
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  load_bert_hf_weights(dir, l.info, *l.model, *l.params);
  return l;
}

Tensor to_i32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i)
    out.data<int32_t>()[i] = static_cast<int32_t>(t.data<int64_t>()[i]);
  return out;
}

void run_oracle(const std::string& arch) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  const std::string root = g_oracle_dir + "/" + arch;
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  Loaded l = load(root + "/model");
  const TransformerConfig& c = l.model->config();
  EXPECT_EQ(c.post_layernorm, arch == "bert");

  const Tensor tokens = expected.read("tokens"), types = expected.read("types");
  const Tensor padding = to_i32(expected.read("padding_mask"));
  const Tensor labels = expected.read("labels"), is_random = expected.read("is_random");
  const Tensor loss_mask = expected.read("loss_mask");
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = c.vocab_size;
  const BertInputs in{tokens, types, padding, labels};

  // Logits: ours [S B, Vp] (row t B + b) against PyTorch's [B, S, V].
  {
    BertModel::Ctx ctx;
    const auto [mlm, sop] = l.model->forward_logits(in, ctx, ForwardMode{});
    Tensor got = Tensor::empty({B, S, V});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t v = 0; v < V; ++v)
          got.data<float>()[(b * S + t) * V + v] =
              mlm.data<float>()[(t * B + b) * c.padded_vocab_size + v];
    EXPECT_TRUE(testing::allclose(got, expected.read("mlm_logits"), 1e-5, 1e-4)) << "MLM logits";
    EXPECT_TRUE(testing::allclose(sop, expected.read("sop_logits"), 1e-5, 1e-4)) << "SOP logits";
  }

  // Losses and gradients through the trainer's path: BertModel stage outputs -> BertLoss.
  BertModel::Ctx ctx;
  const BertModel::Outputs out = l.model->forward_stage(Tensor(), in, is_random, ctx, ForwardMode{});
  TensorMap outputs{{"per-token loss", out.token_loss}, {"sop loss", out.sop_loss}};
  TensorMap batch{{"loss_mask", loss_mask}};
  TensorMap dout;
  const LossTerms terms = BertLoss().forward(outputs, batch, ObjectiveScale{}, &dout);
  const double lm = expected.read("lm_loss").item(0), sop = expected.read("sop_loss").item(0);
  EXPECT_NEAR(terms.at("lm loss").value(), lm, 1e-5 * lm) << "lm loss";
  EXPECT_NEAR(terms.at("sop loss").value(), sop, 1e-5 * sop) << "sop loss";

  l.params->zero_grads();
  l.model->backward_stage(dout.at("per-token loss"), dout.at("sop loss"), Tensor(), ctx);
  const auto grads = bert_hf_tensors(*l.model, true);
  ASSERT_FALSE(grads.empty());
  for (const auto& [name, g] : grads) {
    const Tensor want = expected.read("grad." + name);
    const bool key_bias = name.find("attention.self.key.bias") != std::string::npos;
    EXPECT_TRUE(testing::allclose(g, want, 1e-6, key_bias ? 0.0 : 1e-3))
        << "gradient of " << name;
  }

  // Export: the same tensors, bit for bit, under the same names (the tied decoder once).
  const std::string out_dir = testing::scratch_dir("bert_hf_export_" + arch);
  save_bert_hf(out_dir, l.info, *l.model);
  auto src = safetensors::SafetensorsDir::open(root + "/model");
  auto dst = safetensors::SafetensorsDir::open(out_dir);
  EXPECT_EQ(src.names(), dst.names());
  for (const std::string& name : src.names()) {
    if (!dst.contains(name)) continue;
    const Tensor a = src.read(name), b = dst.read(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name << " differs after export";
  }
  EXPECT_EQ(read_bert_hf_config(out_dir).config.post_layernorm, c.post_layernorm);
}

TEST(BertPyTorchOracle, PostLnBertForPreTraining) {
  run_oracle("bert");
}
TEST(BertPyTorchOracle, PreLnMegatronBertForPreTraining) {
  run_oracle("megatron-bert");
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatron::g_oracle_dir = argv[1];
  return RUN_ALL_TESTS();
}
