// T5Model gradients: every parameter of tiny encoder-decoder models, in fp64, against central
// finite differences of the masked mean loss, for Megatron's default form (learned positions
// shared by both stacks, LayerNorm, biases, erf GELU, tied head with a bias) and the T5 v1.1 form
// (relative position buckets, RMSNorm, GeGLU with tanh GELU, no biases, untied head, unscaled
// scores), with padding in both stacks; once with dropout (the counter-based masks are a pure
// function of (seed, stream), so the loss stays a smooth function of the weights). This covers
// cross-attention, the relative bias tables and GeGLU's backward.
//
// Tolerance: step 1e-6 in fp64 gives ~1e-9 truncation + rounding error on O(1) losses; 1e-7
// absolute plus 1e-5 relative leaves margin without hiding a wrong term (those are O(1e-2+)).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <omp.h>

#include "models/t5/t5_model.h"
#include "tensor/ops.h"
#include "testing/testing.h"
#include "transformer/relative_position.h"

namespace megatron {
namespace {

TransformerConfig megatron_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.decoder_num_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.seq_length = 6;
  c.decoder_seq_length = 4;
  c.max_position_embeddings = 7;
  c.vocab_size = 29;
  c.padded_vocab_size = 32;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.init_method_std = 0.3;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.finalize();
  return c;
}

TransformerConfig v11_config() {
  TransformerConfig c = megatron_config();
  c.decoder_num_layers = 2;
  c.ffn_hidden_size = 12;
  c.normalization = Normalization::kRMSNorm;
  c.gated_gelu = true;
  c.openai_gelu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRelative;
  c.relative_attention_num_buckets = 6;  // max_exact 1 (encoder), 3 (decoder): log buckets used
  c.relative_attention_max_distance = 5;
  c.softmax_scale = 1.0;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  return c;
}

struct Fixture {
  T5Model model;
  ParamSet params;
  T5Inputs in;
  Fixture(const TransformerConfig& cfg)
      : model(cfg), params(model.parameters(), cfg.compute_dtype) {
    params.initialize(1234);
    // Perturb norm weights and biases away from 1 / 0 so their gradients are generic.
    for (Param* p : params.params()) {
      if (p->init != Init::kNormal) {
        Tensor noise = testing::random_tensor(p->shape, stable_hash(p->name), 0.2, DType::kF64);
        ops::add_inplace(p->main, noise);
      }
    }
    params.sync_compute_from_main();
    const int64_t se = cfg.seq_length, sd = cfg.decoder_seq_length;
    in.enc_tokens = testing::random_ids({2, se}, 5, cfg.vocab_size);
    in.dec_tokens = testing::random_ids({2, sd}, 6, cfg.vocab_size);
    in.labels = testing::random_ids({2, sd}, 7, cfg.vocab_size);
    // Sequence 1 is padded in both stacks (its last encoder and decoder positions).
    in.enc_valid = Tensor::full({2, se}, 1, DType::kI32);
    in.dec_valid = Tensor::full({2, sd}, 1, DType::kI32);
    for (int64_t t = se - 2; t < se; ++t) in.enc_valid.data<int32_t>()[se + t] = 0;
    in.dec_valid.data<int32_t>()[sd + sd - 1] = 0;
    in.labels.data<int64_t>()[sd + sd - 1] = -1;
  }
  // The masked mean loss (the padded label counts nowhere).
  Tensor mask() const {
    Tensor m = Tensor::empty(in.labels.shape(), DType::kF64);
    for (int64_t i = 0; i < m.numel(); ++i)
      m.data<double>()[i] = in.labels.data<int64_t>()[i] >= 0 ? 1.0 : 0.0;
    return m;
  }
  double loss(const ForwardMode& mode) {
    T5Model::Ctx ctx;
    const Tensor l = model.forward(in, ctx, mode);
    const Tensor m = mask();
    double s = 0, n = 0;
    for (int64_t i = 0; i < l.numel(); ++i) {
      s += l.item(i) * m.item(i);
      n += m.item(i);
    }
    return s / n;
  }
};

void check_all_gradients(const TransformerConfig& cfg, const ForwardMode& mode) {
  omp_set_num_threads(1);  // thousands of tiny forwards: barriers would only cost
  Fixture f(cfg);
  T5Model::Ctx ctx;
  f.model.forward(f.in, ctx, mode);
  Tensor d = f.mask();
  double n = 0;
  for (int64_t i = 0; i < d.numel(); ++i) n += d.item(i);
  ops::scale_inplace(d, 1.0 / n);
  f.params.zero_grads();
  f.model.backward(d, ctx);

  const double h = 1e-6;
  for (Param* p : f.params.params()) {
    double* w = p->main.data<double>();
    double norm = 0;
    for (int64_t i = 0; i < p->main.numel(); ++i) {
      const double orig = w[i];
      w[i] = orig + h;
      const double lp = f.loss(mode);
      w[i] = orig - h;
      const double lm = f.loss(mode);
      w[i] = orig;
      const double fd = (lp - lm) / (2 * h);
      const double got = p->main_grad.data<double>()[i];
      norm += fd * fd;
      ASSERT_NEAR(got, fd, 1e-7 + 1e-5 * std::fabs(fd)) << p->name << " element " << i;
    }
    // Every parameter matters (a part left out of the graph would pass with zeros), except the
    // padding rows of the vocabulary.
    EXPECT_GT(norm, 1e-12) << p->name << " has no gradient at all";
  }
}

TEST(T5ModelGradients, MegatronDefaultAllParamsMatchFiniteDifferences) {
  check_all_gradients(megatron_config(), ForwardMode{});
}

TEST(T5ModelGradients, T5v11RelativeGegluAllParamsMatchFiniteDifferences) {
  check_all_gradients(v11_config(), ForwardMode{});
}

TEST(T5ModelGradients, WithHiddenAndAttentionDropout) {
  TransformerConfig c = v11_config();
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.2;
  check_all_gradients(c, ForwardMode{true, 77, 3});
}

// The decoder never sees the encoder's padding: changing a padded encoder token changes no loss.
TEST(T5Model, PaddedEncoderPositionsAreInvisible) {
  Fixture f(v11_config());
  const double before = f.loss(ForwardMode{});
  const int64_t se = f.in.enc_tokens.dim(1);
  f.in.enc_tokens.data<int64_t>()[se + se - 1] = 3;
  f.in.enc_tokens.data<int64_t>()[se + se - 2] = 4;
  EXPECT_EQ(f.loss(ForwardMode{}), before);
  // A real one does.
  f.in.enc_tokens.data<int64_t>()[se] = (f.in.enc_tokens.data<int64_t>()[se] + 1) % 29;
  EXPECT_NE(f.loss(ForwardMode{}), before);
}

// T5's buckets at the defaults (32 buckets, distance 128), from the definition: exact distances
// below 8 (bidirectional: 16 per direction) and below 16 (causal), later keys in the upper half
// bidirectionally and in bucket 0 causally, and the last bucket from max_distance on.
TEST(RelativePositionBucket, FollowsT5sDefinition) {
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_EQ(relative_position_bucket(-d, true, 32, 128), d);
    EXPECT_EQ(relative_position_bucket(d, true, 32, 128), d == 0 ? 0 : 16 + d);
  }
  for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(relative_position_bucket(-d, false, 32, 128), d);
  EXPECT_EQ(relative_position_bucket(5, false, 32, 128), 0);
  EXPECT_EQ(relative_position_bucket(-128, true, 32, 128), 15);
  EXPECT_EQ(relative_position_bucket(-5000, true, 32, 128), 15);
  EXPECT_EQ(relative_position_bucket(5000, true, 32, 128), 31);
  EXPECT_EQ(relative_position_bucket(-5000, false, 32, 128), 31);
  // Log buckets: 8 + trunc(log(d / 8) / log(16) * 8): d = 16 -> 10, d = 64 -> 14.
  EXPECT_EQ(relative_position_bucket(-16, true, 32, 128), 10);
  EXPECT_EQ(relative_position_bucket(-64, true, 32, 128), 14);
}

// A max distance inside the causal buckets' exact range would put every farther key in a bucket
// computed from log(1) = 0: refused by name.
TEST(RelativePositionBucket, MaxDistanceMustExceedTheExactRange) {
  TransformerConfig c = v11_config();
  c.relative_attention_num_buckets = 32;
  c.relative_attention_max_distance = 16;
  try {
    c.finalize();
    FAIL() << "max distance 16 with 32 buckets was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--relative-attention-max-distance"), std::string::npos);
  }
  c.relative_attention_max_distance = 17;
  c.finalize();
}

}  // namespace
}  // namespace megatron
