// Heterogeneous layers (transformer/heterogeneous_config.h, Llama-Nemotron's block_configs):
// Megatron's reading of the block list (its conversions and defaults, refusals named), each
// branch kind's layer by finite differences in fp64, the Params a layer holds (Megatron's names,
// its own sizes), and the FLOPs count per layer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/error.h"
#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_hf.h"
#include "testing/layer_gradients.h"
#include "testing/testing.h"
#include "transformer/heterogeneous_config.h"
#include "transformer/transformer_layer.h"

namespace megatron {
namespace {

// Megatron's MLPConfig.ffn_mult_to_intermediate_size on Llama-3.3-Nemotron-Super-49B's sizes
// (hidden 8192): int(2 m h / 3) rounded up to 256. Values computed with Megatron's function.
TEST(HeterogeneousConfig, FfnMultIsMegatronsRounding) {
  EXPECT_EQ(ffn_mult_to_intermediate_size(2.625, 8192), 14336);  // Llama 3 70B's width
  EXPECT_EQ(ffn_mult_to_intermediate_size(1.3125, 8192), 7168);
  EXPECT_EQ(ffn_mult_to_intermediate_size(0.5, 8192), 2816);  // 2730 -> 2816
  EXPECT_EQ(ffn_mult_to_intermediate_size(2.0, 64), 256);     // 85 -> 256
  EXPECT_EQ(ffn_mult_to_intermediate_size(7.0, 64), 512);     // 298 -> 512
}

TEST(HeterogeneousConfig, ReadsMegatronsKeysAndDefaults) {
  const std::string text = R"({"block_configs": [
    {"attention": {"n_heads_in_group": 8, "no_op": false, "replace_with_linear": false},
     "ffn": {"ffn_mult": 2.625, "no_op": false, "replace_with_linear": false}},
    {"attention": {"n_heads_in_group": null, "no_op": true, "replace_with_linear": false},
     "ffn": {"ffn_mult": null, "no_op": false, "replace_with_linear": true}},
    {"attention": {"num_query_groups": 4, "replace_with_linear": false},
     "mlp": {"ffn_hidden_size": 1000}},
    {"attention": {"replace_with_linear": true}, "ffn": {"no_op": true}}]})";
  const HeterogeneousConfig h = parse_heterogeneous_config(text, 64, 8192, "test");
  ASSERT_EQ(h.blocks.size(), 4u);
  EXPECT_EQ(h.json, text);
  EXPECT_EQ(h.blocks[0].attention, BranchKind::kWhole);
  EXPECT_EQ(h.blocks[0].num_query_groups, 8);  // 64 heads / 8 per group
  EXPECT_EQ(h.blocks[0].ffn_hidden_size, 14336);
  EXPECT_EQ(h.blocks[1].attention, BranchKind::kNoOp);
  EXPECT_EQ(h.blocks[1].mlp, BranchKind::kLinear);
  EXPECT_EQ(h.blocks[1].num_query_groups, 0);  // null: the model's
  EXPECT_EQ(h.blocks[2].num_query_groups, 4);  // Megatron's own key, and "mlp" for "ffn"
  EXPECT_EQ(h.blocks[2].ffn_hidden_size, 1000);
  EXPECT_EQ(h.blocks[3].attention, BranchKind::kLinear);
  EXPECT_EQ(h.blocks[3].mlp, BranchKind::kNoOp);
  EXPECT_EQ(h.block(3), &h.blocks[3]);
  EXPECT_EQ(h.block(4), nullptr);
}

TEST(HeterogeneousConfig, RefusesWhatItCannotBuildNamingTheKey) {
  auto error = [](const std::string& blocks, int64_t heads = 8) {
    try {
      parse_heterogeneous_config(R"({"block_configs": [)" + blocks + "]}", heads, 64, "cfg.json");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string ffn = R"("ffn": {"ffn_mult": 1.0})";
  EXPECT_NE(error(R"({"attention": {"n_heads_in_group": 3}, )" + ffn + "}")
                .find("must be a multiple of it"),
            std::string::npos);
  EXPECT_NE(error(R"({"attention": {"window_length": 128}, )" + ffn + "}")
                .find("block_configs[0].attention.window_length"),
            std::string::npos);
  EXPECT_NE(error(R"({"attention": {"no_op": true, "replace_with_linear": true}, )" + ffn + "}")
                .find("choose one"),
            std::string::npos);
  EXPECT_NE(error(R"({"attention": {}, "ffn": {"hidden_act": "relu"}})").find("only silu"),
            std::string::npos);
  EXPECT_NE(error(R"({"attention": {}})").find("needs an \"ffn\""), std::string::npos);
  EXPECT_NE(error(R"({"attention": {"n_heads_in_group": "8"}, )" + ffn + "}").find("wrong type"),
            std::string::npos);
  EXPECT_NE(
      error(R"({"attention": {"no_op": true, "num_query_groups": 2}, )" + ffn + "}").find("no-op"),
      std::string::npos);
  try {
    parse_heterogeneous_config("{\"layers\": []}", 8, 64, "cfg.json");
    ADD_FAILURE() << "a config without block_configs was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json has no \"block_configs\""), std::string::npos);
  }
}

TEST(HeterogeneousConfig, ModelArgsForMegatronsCheck) {
  const HeterogeneousModelArgs m = heterogeneous_model_args(
      R"({"hidden_act": "silu", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 8, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0},
          "block_configs": [{"attention": {"n_heads_in_group": null}},
                            {"attention": {"n_heads_in_group": 2}},
                            {"attention": {"n_heads_in_group": 4}}]})",
      "cfg.json");
  EXPECT_EQ(m.num_query_groups, 4);  // heads / the first non-null n_heads_in_group
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.rope_scaling_factor, 8.0);
}

struct SelfGroup {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TensorParallelContext tp() const { return TensorParallelContext{group.get(), false, {}}; }
};

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 8;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 12;
  c.seq_length = 6;
  c.vocab_size = 16;
  c.padded_vocab_size = 16;
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0;
  c.init_method_std = 0.4;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.heterogeneous.blocks = {{BranchKind::kWhole, BranchKind::kWhole, 1, 20},
                            {BranchKind::kLinear, BranchKind::kNoOp, 0, 0},
                            {BranchKind::kNoOp, BranchKind::kLinear, 0, 0},
                            {BranchKind::kNoOp, BranchKind::kNoOp, 0, 0}};
  c.heterogeneous.json = "{}";
  c.finalize();
  return c;
}

// Each layer kind with hidden dropout (the linear branches' too), by finite differences in fp64
// (testing/layer_gradients.h); the all-no-op layer 3 has no Params (ParameterNamesAndShapes
// checks that it passes its input through).
TEST(HeterogeneousLayers, GradientsMatchFiniteDifferences) {
  SelfGroup g;
  const TransformerConfig cfg = config();
  const Tensor x = testing::random_tensor({6, 2, 8}, 7, 1.0, DType::kF64);
  for (int64_t l = 0; l < 3; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    TransformerLayer layer("layer", cfg, l, g.tp());
    TransformerLayer::Ctx ctx;
    std::vector<Param*> ps;
    layer.collect(ps);
    const ForwardMode training{true, 5, 9};
    testing::check_layer_gradients({ps,
                                    [&](const Tensor& in) {
                                      ctx = {};
                                      return layer.forward(in, TokenLayout{}, ctx, training);
                                    },
                                    [&](const Tensor& dy) { return layer.backward(dy, ctx); }},
                                   x, 13 + static_cast<uint64_t>(l));
  }
}

// Megatron's names (the linear replacement is the attention or MLP module itself, its norm
// Megatron's input or pre-MLP norm) and each layer's own sizes.
TEST(HeterogeneousLayers, ParameterNamesAndShapes) {
  SelfGroup g;
  const TransformerConfig cfg = config();
  auto params_of = [&](int64_t l) {
    TransformerLayer layer("decoder.layers." + std::to_string(l), cfg, l, g.tp());
    std::vector<Param*> ps;
    layer.collect(ps);
    std::vector<std::pair<std::string, Shape>> got;
    for (const Param* p : ps) got.emplace_back(p->name, p->shape);
    return got;
  };
  using Named = std::vector<std::pair<std::string, Shape>>;
  EXPECT_EQ(params_of(0), (Named{{"decoder.layers.0.input_layernorm.weight", {8}},
                                 {"decoder.layers.0.self_attention.linear_qkv.weight", {12, 8}},
                                 {"decoder.layers.0.self_attention.linear_proj.weight", {8, 8}},
                                 {"decoder.layers.0.pre_mlp_layernorm.weight", {8}},
                                 {"decoder.layers.0.mlp.linear_fc1.weight", {40, 8}},
                                 {"decoder.layers.0.mlp.linear_fc2.weight", {8, 20}}}));
  EXPECT_EQ(params_of(1), (Named{{"decoder.layers.1.input_layernorm.weight", {8}},
                                 {"decoder.layers.1.self_attention.weight", {8, 8}}}));
  EXPECT_EQ(params_of(2), (Named{{"decoder.layers.2.pre_mlp_layernorm.weight", {8}},
                                 {"decoder.layers.2.mlp.weight", {8, 8}}}));
  EXPECT_EQ(params_of(3), Named{});
  // A layer of no-ops passes its input through, as a copy.
  TransformerLayer empty("x", cfg, 3, g.tp());
  TransformerLayer::Ctx ctx;
  const Tensor x = testing::random_tensor({6, 2, 8}, 3, 1.0, DType::kF64);
  const Tensor y = empty.forward(x, TokenLayout{}, ctx, ForwardMode{true, 1, 2});
  EXPECT_NE(y.raw(), x.raw());
  EXPECT_TRUE(testing::allclose(y, x, 0, 0));
}

// The FLOPs per iteration: each layer by its branches, against the formula's terms written out
// (12 s h^2 units per token: attention (1 + g/n + s/h), MLP ffn/h x 1.5 for SwiGLU, a linear
// replacement 1/2, the output layer V/(2h)).
TEST(HeterogeneousLayers, FlopsCountEachLayersBranches) {
  TransformerConfig c = config();
  const double B = 3, s = 6, h = 8, n = 4;
  const double units = (1 + 1 / n + s / h) + 20 / h * 1.5  // layer 0: 1 group, MLP 20
                       + 0.5                               // layer 1: linear attention
                       + 0.5;                              // layer 2: linear MLP
  const double want = 12 * B * s * h * h * (units + 16 / (2 * h));
  EXPECT_NEAR(model_flops_per_iteration(c, 3), want, 1e-9 * want);
}

// The Hugging Face config of a model whose block list uses Megatron's own keys (num_query_groups,
// ffn_hidden_size, "mlp"): written in DeciLM's keys (n_heads_in_group, ffn_mult), which read back
// as the same blocks; a width DeciLM cannot express (not a multiple of 256) is refused.
TEST(HeterogeneousLayers, HuggingFaceExportWritesDeciLMKeys) {
  TransformerConfig c = config();
  c.hidden_size = 64;
  c.kv_channels = 16;
  c.swiglu = true;
  c.heterogeneous = parse_heterogeneous_config(R"({"block_configs": [
    {"attention": {"num_query_groups": 1}, "mlp": {"ffn_hidden_size": 512}},
    {"attention": {"replace_with_linear": true}, "mlp": {"no_op": true}},
    {"attention": {"no_op": true}, "mlp": {"replace_with_linear": true}},
    {"attention": {"num_query_groups": 4}, "mlp": {"ffn_hidden_size": 256}}]})",
                                               4, 64, "test");
  c.ffn_hidden_size = 256;
  const HfModelInfo info = hf_info_from_config(c, HfArch::kLlama);
  EXPECT_EQ(info.raw["model_type"], "nemotron-nas");
  const nlohmann::json& blocks = info.raw["block_configs"];
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0]["attention"]["n_heads_in_group"], 4);
  EXPECT_EQ(blocks[0]["ffn"]["ffn_mult"], 12.0);  // 1.5 x 512 / 64
  EXPECT_TRUE(blocks[1]["attention"]["replace_with_linear"].get<bool>());
  EXPECT_TRUE(blocks[1]["ffn"]["no_op"].get<bool>());
  const HeterogeneousConfig back = parse_heterogeneous_config(info.raw.dump(), 4, 64, "export");
  ASSERT_EQ(back.blocks.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.blocks[i].attention, c.heterogeneous.blocks[i].attention) << i;
    EXPECT_EQ(back.blocks[i].mlp, c.heterogeneous.blocks[i].mlp) << i;
    EXPECT_EQ(back.blocks[i].num_query_groups, c.heterogeneous.blocks[i].num_query_groups) << i;
    EXPECT_EQ(back.blocks[i].ffn_hidden_size, c.heterogeneous.blocks[i].ffn_hidden_size) << i;
  }
  c.heterogeneous.blocks[3].ffn_hidden_size = 300;
  EXPECT_THROW(hf_info_from_config(c, HfArch::kLlama), InvalidArgument);
}

}  // namespace
}  // namespace megatron
