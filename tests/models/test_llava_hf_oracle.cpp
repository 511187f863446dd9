// The PyTorch oracle of LLaVA: tests/reference/llava_oracle.py writes a tiny
// LlavaForConditionalGeneration directory (CLIP vision tower with one unused last layer,
// projector, Llama text model) with random weights, and PyTorch's logits, loss and every used
// weight's gradient for a batch of three samples with the image token at the start, in the
// middle and at the end. We load the directory through our importer, splice with
// models/llava/image_splice, and must reproduce all of it; export must give the files back.
//
// Usage: test_llava_hf_oracle ORACLE_DIR (CTest runs the Python script first, as a fixture).
//
// Tolerances (both sides f32, different summation orders and kernels), as the GPT oracle's:
// - logits: |err| <= 1e-5 + 1e-4 |x| (O(1) sums over h = 32 or fewer products; f32 rounding ~1e-6).
// - loss: 1e-5 relative.
// - gradients: |err| <= 1e-6 + 1e-3 |g|: a wrong term shows up as O(|g|), far above it.
// - export: exact (the same f32 bits).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_dir.h"
#include "models/llava/image_splice.h"
#include "models/llava/llava_hf.h"
#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron {
namespace {

std::string g_oracle_dir;

struct Loaded {
  LlavaHfInfo info;
  std::unique_ptr<LlavaModel> model;
  std::unique_ptr<ParamSet> params;
};

Loaded load(const std::string& dir, int64_t seq) {
  Loaded l;
  l.info = read_llava_hf_config(dir);
  TransformerConfig c = l.info.config;
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, 128);
  c.seq_length = seq;
  c.vision.text_seq_length = 0;
  c.finalize();
  l.model = std::make_unique<LlavaModel>(c, GPTStage{});
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  load_llava_hf_weights(dir, l.info, *l.model, *l.params);
  return l;
}

TEST(LlavaOracle, ConfigAsTransformersReadsIt) {
  const LlavaHfInfo info = read_llava_hf_config(g_oracle_dir + "/model");
  const VisionConfig& v = info.config.vision;
  EXPECT_EQ(v.num_layers, 2);  // 3 in the files, vision_feature_layer -2
  EXPECT_EQ(info.vision_layers_in_file, 3);
  EXPECT_EQ(v.hidden_size, 24);
  EXPECT_EQ(v.patch_dim, 4);
  EXPECT_FALSE(v.class_token);  // vision_feature_select_strategy "default"
  EXPECT_EQ(v.num_image_embeddings(), 9);
  EXPECT_EQ(info.config.num_query_groups, 2);
  EXPECT_TRUE(info.config.untie_embeddings_and_output_weights);
}

TEST(LlavaOracle, LogitsLossAndGradients) {
  auto expected = safetensors::File::open(g_oracle_dir + "/expected.safetensors");
  const Tensor tokens = expected.read("tokens"), labels = expected.read("labels");
  const Tensor loss_mask = expected.read("loss_mask"), images = expected.read("images");
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  const Tensor want_logits = expected.read("logits");  // [B, S, V]
  const int64_t S = want_logits.dim(1), V = want_logits.dim(2);
  Loaded l = load(g_oracle_dir + "/model", S);
  const TransformerConfig& c = l.model->config();

  SpliceInput in;
  in.batch = B;
  in.text_len = T;
  in.input_ids.assign(tokens.data<int64_t>(), tokens.data<int64_t>() + B * T);
  in.labels.assign(labels.data<int64_t>(), labels.data<int64_t>() + B * T);
  in.loss_mask.assign(loss_mask.data<float>(), loss_mask.data<float>() + B * T);
  in.num_image_tiles.assign(static_cast<size_t>(B), 1);
  in.img_seq_len = c.vision.num_image_embeddings();
  in.language_max_seq_len = S;
  in.pad_to_max = true;
  const SpliceLayout layout = splice_image_tokens(in);
  ASSERT_EQ(layout.seq_len, S);
  Tensor spliced = Tensor::empty({B, S}, DType::kI64), mask = Tensor::empty({B, S});
  for (int64_t k = 0; k < B * S; ++k) {
    spliced.data<int64_t>()[k] = std::max<int64_t>(layout.labels[static_cast<size_t>(k)], 0);
    mask.data<float>()[k] = layout.loss_mask[static_cast<size_t>(k)];
  }

  LlavaModel::Ctx ctx;
  const Tensor per_token = l.model->forward_stage(
      Tensor(), LlavaInputs{tokens, Tensor(), images, spliced}, ctx, ForwardMode{});
  Tensor got_logits = Tensor::empty({B, S, V});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t v = 0; v < V; ++v)
        got_logits.data<float>()[(b * S + t) * V + v] =
            ctx.lm.head.logits.data<float>()[(t * B + b) * c.padded_vocab_size + v];
  EXPECT_TRUE(testing::allclose(got_logits, want_logits, 1e-5, 1e-4)) << "logits";
  const ops::MaskedSum masked = ops::masked_sum(per_token, mask);
  const double want_loss = expected.read("loss").item(0);
  EXPECT_NEAR(masked.sum / masked.count, want_loss, 1e-5 * want_loss) << "loss";

  l.params->zero_grads();
  Tensor dloss = mask.clone();
  ops::scale_inplace(dloss, 1.0 / masked.count);
  l.model->backward_stage(dloss, ctx);
  const auto grads = llava_to_hf_tensors(l.info, *l.model, true);
  int64_t checked = 0;
  for (const auto& [name, g] : grads) {
    EXPECT_TRUE(testing::allclose(g, expected.read("grad." + name), 1e-6, 1e-3))
        << "gradient of " << name;
    ++checked;
  }
  // Every used tensor: the tower's 5 + 2 layers x 16, the projector's 4, the text model's 21.
  EXPECT_EQ(checked, 62);
}

// Import -> export with the source directory reproduces every tensor of the files (the unused
// ones copied), bit for bit; export without it (a model trained here: every layer used,
// vision_feature_layer -1) re-imports to the same weights.
TEST(LlavaOracle, ExportRoundTripIsExact) {
  const std::string src = g_oracle_dir + "/model";
  Loaded l = load(src, 15);
  const std::string out = g_oracle_dir + "/export";
  std::filesystem::remove_all(out);
  save_llava_hf(out, l.info, *l.model, src);
  auto a = safetensors::SafetensorsDir::open(src);
  auto b = safetensors::SafetensorsDir::open(out);
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    const Tensor x = a.read(n), y = b.read(n);
    ASSERT_EQ(x.shape(), y.shape()) << n;
    ASSERT_EQ(x.dtype(), y.dtype()) << n;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << n << " differs";
  }

  const std::string fresh = g_oracle_dir + "/export-fresh";
  std::filesystem::remove_all(fresh);
  const LlavaHfInfo info = llava_hf_info_from_config(l.model->config());
  EXPECT_EQ(info.raw["vision_feature_layer"], -1);
  save_llava_hf(fresh, info, *l.model, "");
  Loaded back = load(fresh, 15);
  EXPECT_EQ(back.model->config().vision.num_layers, 2);
  const std::vector<Param*> x = l.model->parameters(), y = back.model->parameters();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i]->name, y[i]->name);
    EXPECT_EQ(std::memcmp(x[i]->main.raw(), y[i]->main.raw(), x[i]->main.nbytes()), 0)
        << x[i]->name;
  }
}

// Megatron's combine step with the vision tower from its own checkpoint: a CLIPVisionModel
// directory (the oracle's tower renamed vision_model.*, its config alone) loads into a fresh
// model's vision encoder exactly, leaving every other parameter as initialised; a tower of another
// size is refused naming the flag to set.
TEST(LlavaOracle, VisionTowerFromItsOwnDirectory) {
  const std::string src = g_oracle_dir + "/model";
  Loaded want = load(src, 15);
  const std::string clip = g_oracle_dir + "/clip";
  std::filesystem::remove_all(clip);
  std::filesystem::create_directories(clip);
  auto st = safetensors::SafetensorsDir::open(src);
  std::vector<std::pair<std::string, Tensor>> tower;
  const std::string prefix = "vision_tower.";
  for (const std::string& n : st.names())
    if (n.rfind(prefix, 0) == 0) tower.emplace_back(n.substr(prefix.size()), st.read(n));
  safetensors::SafetensorsDir::write(clip, tower);
  nlohmann::json config = want.info.raw["vision_config"];
  config["model_type"] = "clip_vision_model";
  std::ofstream(clip + "/config.json") << config.dump(2);

  TransformerConfig c = want.model->config();
  LlavaModel fresh(c, GPTStage{});
  ParamSet params(fresh.parameters(), DType::kF32);
  params.initialize(7);
  std::vector<Param*> before_lm = fresh.language_model.parameters();
  std::vector<Tensor> lm_init;
  for (Param* p : before_lm) lm_init.push_back(p->main.clone());
  load_clip_vision_weights(clip, fresh, params);
  std::vector<Param*> got, ref;
  fresh.vision_model->collect(got);
  want.model->vision_model->collect(ref);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::memcmp(got[i]->main.raw(), ref[i]->main.raw(), got[i]->main.nbytes()), 0)
        << got[i]->name;
  }
  for (size_t i = 0; i < before_lm.size(); ++i) {
    EXPECT_EQ(std::memcmp(before_lm[i]->main.raw(), lm_init[i].raw(), lm_init[i].nbytes()), 0)
        << before_lm[i]->name << " changed";
  }

  TransformerConfig other = c;
  other.vision.hidden_size = 48;
  other.vision.num_attention_heads = 3;
  LlavaModel wrong(other, GPTStage{});
  ParamSet wrong_params(wrong.parameters(), DType::kF32);
  try {
    load_clip_vision_weights(clip, wrong, wrong_params);
    ADD_FAILURE() << "a tower of hidden size 24 loaded into one of 48";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--vision-hidden-size 24"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatron::g_oracle_dir = argv[1];
  return RUN_ALL_TESTS();
}
