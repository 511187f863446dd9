// Whole-model gradient checks: every parameter gradient of tiny GPT-2-style and Llama-style
// models, in fp64, against central finite differences of the loss. Dropout is on in one case:
// the counter-based masks are a pure function of (seed, stream), so the loss is a deterministic
// smooth function of the weights and finite differences apply.
//
// Tolerance: step 1e-6 in fp64 gives ~1e-9 truncation + rounding error on O(1) losses; 1e-7
// absolute plus 1e-5 relative leaves margin without hiding a wrong term (those are O(1e-2+)).
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <string>

#include <cmath>
#include <cstdio>

#include <omp.h>

#include "core/philox.h"
#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_model.h"
#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron {
namespace {

TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.seq_length = 5;
  c.max_position_embeddings = 7;
  c.vocab_size = 37;
  c.padded_vocab_size = 40;
  c.openai_gelu = true;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.init_method_std = 0.3;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.finalize();
  return c;
}

TransformerConfig llama_config() {
  TransformerConfig c = gpt2_config();
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 0;
  c.ffn_hidden_size = 12;
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.openai_gelu = false;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  return c;
}

struct Fixture {
  GPTModel model;
  ParamSet params;
  Tensor tokens, labels;
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
    tokens = testing::random_ids({2, cfg.seq_length}, 5, cfg.vocab_size);
    labels = testing::random_ids({2, cfg.seq_length}, 6, cfg.vocab_size);
  }
  double loss(const ForwardMode& mode) {
    GPTModel::Ctx ctx;
    Tensor l = model.forward(tokens, labels, Tensor(), ctx, mode);
    double s = 0;
    for (int64_t i = 0; i < l.numel(); ++i) s += l.item(i);
    return s / static_cast<double>(l.numel());
  }
};

void check_all_gradients(const TransformerConfig& cfg, const ForwardMode& mode) {
  // Thousands of forwards of a model this small: one thread. Threads would only add OpenMP
  // barriers, and on a loaded machine each barrier waits for a descheduled thread.
  omp_set_num_threads(1);
  Fixture f(cfg);
  GPTModel::Ctx ctx;
  Tensor l = f.model.forward(f.tokens, f.labels, Tensor(), ctx, mode);
  Tensor dloss = Tensor::full(l.shape(), 1.0 / static_cast<double>(l.numel()), DType::kF64);
  f.params.zero_grads();
  f.model.backward(dloss, ctx);

  const double h = 1e-6;
  for (Param* p : f.params.params()) {
    double* w = p->main.data<double>();
    double max_err = 0;
    for (int64_t i = 0; i < p->main.numel(); ++i) {
      const double orig = w[i];
      w[i] = orig + h;
      double lp = f.loss(mode);
      w[i] = orig - h;
      double lm = f.loss(mode);
      w[i] = orig;
      const double fd = (lp - lm) / (2 * h);
      const double got = p->main_grad.data<double>()[i];
      max_err = std::max(max_err, std::fabs(got - fd));
      ASSERT_NEAR(got, fd, 1e-7 + 1e-5 * std::fabs(fd)) << p->name << " element " << i;
    }
    // Padding rows of the vocabulary never receive gradient.
    if (p->is_embedding_or_output) {
      for (int64_t r = cfg.vocab_size; r < cfg.padded_vocab_size; ++r)
        for (int64_t j = 0; j < cfg.hidden_size; ++j)
          ASSERT_EQ(p->main_grad.data<double>()[r * cfg.hidden_size + j], 0.0) << p->name;
    }
  }
}

TEST(GPTModelGradients, Gpt2StyleAllParamsMatchFiniteDifferences) {
  check_all_gradients(gpt2_config(), ForwardMode{});
}

TEST(GPTModelGradients, LlamaStyleAllParamsMatchFiniteDifferences) {
  check_all_gradients(llama_config(), ForwardMode{});
}

// --use-mup's multipliers on the embedding sum and on the logits (and its attention scale, a
// plain softmax scale) are in the gradient like any other term.
TEST(GPTModelGradients, MupMultipliersMatchFiniteDifferences) {
  TransformerConfig c = llama_config();
  c.mup.enabled = true;
  c.mup.width_mult = 2;
  c.mup.embedding_mult = 1.7;
  c.mup.output_mult = 0.5;
  c.softmax_scale = 1.0 / 2.0;  // 1 / head_dim (2)
  c.finalize();
  check_all_gradients(c, ForwardMode{});
}

TEST(GPTModelGradients, WithHiddenAndAttentionDropout) {
  TransformerConfig c = gpt2_config();
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.3;
  check_all_gradients(c, ForwardMode{true, 99, 3});
}

TEST(GPTModel, DropoutOnlyInTrainingAndReproducible) {
  TransformerConfig c = gpt2_config();
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.3;
  Fixture f(c);
  double eval1 = f.loss(ForwardMode{});
  double train1 = f.loss(ForwardMode{true, 99, 3});
  double train2 = f.loss(ForwardMode{true, 99, 3});
  double train3 = f.loss(ForwardMode{true, 99, 4});
  EXPECT_EQ(train1, train2);  // same masks, bit for bit
  EXPECT_NE(train1, eval1);
  EXPECT_NE(train1, train3);  // another micro-batch draws other masks
}

TEST(GPTModel, PaddingLogitsNeverReceiveProbability) {
  TransformerConfig c = gpt2_config();
  Fixture f(c);
  // Make the padding rows of the (tied) embedding huge: with masking, the loss is unchanged.
  double before = f.loss(ForwardMode{});
  Param& we = *f.model.word_embeddings();
  for (int64_t r = c.vocab_size; r < c.padded_vocab_size; ++r)
    for (int64_t j = 0; j < c.hidden_size; ++j) we.main.data<double>()[r * c.hidden_size + j] = 50;
  f.params.sync_compute_from_main();
  EXPECT_EQ(f.loss(ForwardMode{}), before);
}

TEST(GPTModel, InitDependsOnlyOnSeedAndName) {
  TransformerConfig c = gpt2_config();
  Fixture a(c), b(c);
  EXPECT_TRUE(testing::allclose(a.params.main(), b.params.main(), 0, 0));
  // Output projections use the scaled init std / sqrt(2 L).
  Param& proj = a.params.find("decoder.layers.0.self_attention.linear_proj.weight");
  EXPECT_NEAR(proj.init_std, 0.3 / std::sqrt(4.0), 1e-12);
}

// Initialisation draws element i of a weight from Philox(seed, hash(name), i) in parallel: the
// same bits with one thread or two, and the draw's formula exactly, on a word embedding large
// enough (2048 x 64) for the threaded loop.
TEST(GPTModel, InitIsTheSameForAnyThreadCount) {
  TransformerConfig c = gpt2_config();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 2000;
  c.padded_vocab_size = 2048;
  c.finalize();
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  GPTModel one(c), two(c);
  ParamSet a(one.parameters(), c.compute_dtype), b(two.parameters(), c.compute_dtype);
  a.initialize(77);
  omp_set_num_threads(2);
  b.initialize(77);
  omp_set_num_threads(before);
  EXPECT_TRUE(testing::allclose(a.main(), b.main(), 0, 0));
  const Param& emb = b.find("embedding.word_embeddings.weight");
  ASSERT_GT(emb.main.numel(), 65536);
  for (int64_t i : {int64_t{0}, int64_t{65537}, emb.main.numel() - 1}) {
    EXPECT_EQ(emb.main.item(i),
              emb.init_std * Philox::normal(77, stable_hash(emb.name), static_cast<uint64_t>(i)));
  }
}

// --use-mup (Megatron core 0.19): with width multiplier m the matrices are drawn with
// std / sqrt(m) (the output projections' std / sqrt(2 layers) / sqrt(m)), the embeddings and the
// untied output layer with the embeddings' std; the logits are output_mult times the plain
// model's with the same weights, exactly (a power of two); the embedding multiplier scales the
// first layer's input. Sample stds within 5% (n >= 4096 normal samples: the relative standard
// error of a sample std is 1/sqrt(2n) <= 1.1%).
TEST(GPTModel, MupInitAndMultipliers) {
  TransformerConfig c = llama_config();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_query_groups = 4;
  c.ffn_hidden_size = 128;
  c.vocab_size = 200;
  c.padded_vocab_size = 256;
  c.init_method_std = 0.02;
  c.finalize();
  TransformerConfig mup = c;
  mup.mup.enabled = true;
  mup.mup.width_mult = 4;
  mup.finalize();
  GPTModel plain_model(c), mup_model(mup);
  ParamSet plain(plain_model.parameters(), DType::kF64),
      scaled(mup_model.parameters(), DType::kF64);
  plain.initialize(7);
  scaled.initialize(7);
  auto sd = [](const Param& p) {
    double sq = 0;
    for (int64_t i = 0; i < p.main.numel(); ++i) sq += p.main.item(i) * p.main.item(i);
    return std::sqrt(sq / static_cast<double>(p.main.numel()));
  };
  const double out_std = 0.02 / std::sqrt(2.0 * 2);  // 2 layers
  const std::map<std::string, double> want = {
      {"decoder.layers.0.self_attention.linear_qkv.weight", 0.02 / 2},
      {"decoder.layers.0.mlp.linear_fc1.weight", 0.02 / 2},
      {"decoder.layers.1.self_attention.linear_proj.weight", out_std / 2},
      {"decoder.layers.1.mlp.linear_fc2.weight", out_std / 2},
      {"embedding.word_embeddings.weight", 0.02},
      {"output_layer.weight", 0.02}};
  for (const auto& [name, s] : want) {
    EXPECT_NEAR(sd(scaled.find(name)), s, 0.05 * s) << name;
  }
  EXPECT_NEAR(sd(plain.find("output_layer.weight")), 0.02, 0.001);
  // The same weights in both: the logits scale by output_mult.
  const Tensor tokens = testing::random_ids({2, c.seq_length}, 5, c.vocab_size);
  auto logits = [&](GPTModel& m, ParamSet& ps, double out_mult, double emb_mult) {
    for (size_t i = 0; i < ps.params().size(); ++i)
      ps.params()[i]->main.copy_from(plain.params()[i]->main);
    ps.sync_compute_from_main();
    TransformerConfig& cfg = const_cast<TransformerConfig&>(m.config());
    cfg.mup.output_mult = out_mult;
    cfg.mup.embedding_mult = emb_mult;
    GPTModel::Ctx ctx;
    m.forward(tokens, tokens, Tensor(), ctx, ForwardMode{});
    return ctx.head.logits.clone();
  };
  const Tensor one = logits(mup_model, scaled, 1.0, 1.0);
  const Tensor quarter = logits(mup_model, scaled, 0.25, 1.0);
  for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(quarter.item(i), 0.25 * one.item(i));
  const Tensor emb = logits(mup_model, scaled, 1.0, 3.0);
  double diff = 0;
  for (int64_t i = 0; i < one.numel(); ++i)
    diff = std::max(diff, std::abs(emb.item(i) - one.item(i)));
  EXPECT_GT(diff, 1e-3);  // the embedding multiplier reaches the logits
}

// --attention-output-gate's FLOPs (core 0.19's num_floating_point_operations): the gate rows add
// 3 x 2 x hidden x (heads x head dim) per token and layer (forward and two backward GEMMs).
TEST(GPTModel, AttentionOutputGateFlops) {
  TransformerConfig c = llama_config();
  const double plain = model_flops_per_iteration(c, 3);
  c.attention_output_gate = true;
  const double want = plain + 6.0 * 3 *
                                  static_cast<double>(c.seq_length * c.num_layers * c.hidden_size *
                                                      c.num_attention_heads * c.head_dim());
  EXPECT_NEAR(model_flops_per_iteration(c, 3), want, 1e-12 * want);
}

// --init-method-xavier-uniform: every normally initialised matrix (the linear layers, the
// embeddings, the output layer) is U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) of its full
// shape; norms and biases keep theirs. --embedding-init-method-std gives the embeddings their own
// normal std. Checked on a model large enough for the statistics: the bound exactly, the
// variance a^2 / 3 within 10% (n >= 4096 samples: the sample variance of a uniform has a relative
// standard error sqrt(0.8 / n) <= 1.4%, so 10% is 7 errors).
TEST(GPTModel, XavierUniformAndEmbeddingInit) {
  TransformerConfig c = gpt2_config();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 200;
  c.padded_vocab_size = 256;
  c.max_position_embeddings = 64;
  c.seq_length = 64;
  c.untie_embeddings_and_output_weights = true;
  c.init_method_xavier_uniform = true;
  c.finalize();
  auto stats = [](const Param& p) {
    double sum = 0, sq = 0, max = 0;
    for (int64_t i = 0; i < p.main.numel(); ++i) {
      const double v = p.main.item(i);
      sum += v;
      sq += v * v;
      max = std::max(max, std::abs(v));
    }
    const auto n = static_cast<double>(p.main.numel());
    return std::array<double, 3>{sum / n, sq / n - (sum / n) * (sum / n), max};
  };
  // Not the Fixture: it perturbs every parameter whose init is not normal.
  struct Initialised {
    GPTModel model;
    ParamSet params;
    explicit Initialised(const TransformerConfig& cfg)
        : model(cfg), params(model.parameters(), cfg.compute_dtype) {
      params.initialize(1234);
    }
  };
  {
    Initialised f(c);
    for (const std::string name : {"decoder.layers.0.self_attention.linear_qkv.weight",
                                   "decoder.layers.1.mlp.linear_fc2.weight",
                                   "embedding.word_embeddings.weight", "output_layer.weight"}) {
      SCOPED_TRACE(name);
      const Param& p = f.params.find(name);
      EXPECT_EQ(p.init, Init::kXavierUniform);
      const Shape s = p.full_shape();
      const double a = std::sqrt(6.0 / static_cast<double>(s[0] + s[1]));
      const auto [mean, var, max] = stats(p);
      EXPECT_LE(max, a);
      EXPECT_NEAR(var, a * a / 3, 0.1 * a * a / 3);
      EXPECT_NEAR(mean, 0, 4 * a / std::sqrt(3.0 * static_cast<double>(p.main.numel())));
    }
    EXPECT_EQ(f.params.find("decoder.layers.0.input_layernorm.weight").init, Init::kOnes);
  }
  c.embedding_init_method_std = 0.5;
  Initialised g(c);
  const Param& emb = g.params.find("embedding.word_embeddings.weight");
  EXPECT_EQ(emb.init, Init::kNormal);
  EXPECT_NEAR(std::sqrt(stats(emb)[1]), 0.5, 0.05);  // n = 16384: 1% standard error
  EXPECT_EQ(g.params.find("output_layer.weight").init, Init::kXavierUniform);
}

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {

// A model computes where its weights are: built on another device, every activation and gradient
// follows the weights (an op given tensors of two devices throws), and the results equal the CPU
// device's. The reference device runs everywhere (host memory, the fp64 formulas: it catches any
// tensor left behind on the CPU); the CUDA device where a GPU is visible, in f64 and in f32.
// Tolerances: in f64 every device's kernels agree with the reference to NMSE 1e-20 per op (the op
// harness; a relative 1e-10: summation order, and constants the CPU kernels hold in f32), which
// the model's two layers, softmaxes and normalisations compound: measured up to 1.2e-8 of the
// largest gradient of a parameter, so 1e-7 relative to it; CUDA f32
// rounds each op to 24 bits like the CPU's f32 and the two differ in summation order over at most
// a few hundred terms here (1e-4 on O(1) values; a wrong term is O(1e-2) or more).
struct DeviceRun {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // on the host, f64
};

DeviceRun run_on(TransformerConfig cfg, Device device, DType dtype, const ForwardMode& mode) {
  cfg.compute_dtype = dtype;
  GPTModel model(cfg);
  ParamSet params(model.parameters(), dtype, device);
  params.initialize(1234);
  const Tensor tokens = testing::random_ids({2, cfg.seq_length}, 5, cfg.vocab_size).to(device);
  const Tensor labels = testing::random_ids({2, cfg.seq_length}, 6, cfg.vocab_size).to(device);
  GPTModel::Ctx ctx;
  Tensor l = model.forward(tokens, labels, Tensor(), ctx, mode);
  EXPECT_EQ(l.device(), device);
  const Tensor host_loss = to_host(l);
  DeviceRun r;
  for (int64_t i = 0; i < host_loss.numel(); ++i) r.loss += host_loss.item(i) / host_loss.numel();
  Tensor dloss = Tensor::full(l.shape(), 1.0 / static_cast<double>(l.numel()), l.dtype(), device);
  params.zero_grads();
  model.backward(dloss, ctx);
  for (Param* p : params.params()) r.grads[p->name] = to_host(p->main_grad).to(DType::kF64);
  return r;
}

void expect_same_run(const DeviceRun& got, const DeviceRun& want, double tol, const char* what) {
  EXPECT_NEAR(got.loss, want.loss, tol * std::fabs(want.loss)) << what;
  for (const auto& [name, g] : want.grads) {
    double scale = 0;
    for (int64_t i = 0; i < g.numel(); ++i) scale = std::max(scale, std::fabs(g.item(i)));
    EXPECT_TRUE(testing::allclose(got.grads.at(name), g, tol * scale, tol)) << what << " " << name;
  }
}

TEST(GPTModelDevices, ForwardAndBackwardRunWhereTheWeightsAre) {
  for (bool llama : {false, true}) {
    TransformerConfig c = llama ? llama_config() : gpt2_config();
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.2;
    c.finalize();
    const ForwardMode mode{true, 99, 3};
    const DeviceRun cpu = run_on(c, Device::kCPU, DType::kF64, mode);
    expect_same_run(run_on(c, Device::kReference, DType::kF64, mode), cpu, 1e-7,
                    llama ? "llama reference" : "gpt2 reference");
    if (!device_available(Device::kCUDA)) continue;
    expect_same_run(run_on(c, Device::kCUDA, DType::kF64, mode), cpu, 1e-7,
                    llama ? "llama cuda f64" : "gpt2 cuda f64");
    expect_same_run(run_on(c, Device::kCUDA, DType::kF32, mode),
                    run_on(c, Device::kCPU, DType::kF32, mode), 1e-4,
                    llama ? "llama cuda f32" : "gpt2 cuda f32");
  }
}

// A bf16 run on the GPU against the same run on the CPU, with heads of 64 channels and a
// sequence of 80 (a ragged tile) so that attention takes the tensor cores. Both devices round
// the GEMM inputs to bf16 and accumulate in f32; the GPU also rounds attention's q, k, v and
// probabilities to bf16 where the CPU keeps f32 (AttentionSpec::precision): a relative 2^-9 on
// attention's output, which then flips a few bf16 roundings of later GEMM inputs (2^-8 each).
// Measured differences are printed; 5e-2 of the largest gradient of each parameter bounds them,
// while a wrong mask, head or layout moves gradients by O(1) of it.
TEST(GPTModelDevices, Bf16OnTheGpuFollowsTheCpu) {
  std::string why;
  if (!device_available(Device::kCUDA, &why)) GTEST_SKIP() << "no GPU: " << why;
  for (bool llama : {false, true}) {
    TransformerConfig c = llama ? llama_config() : gpt2_config();
    c.hidden_size = 128;
    c.num_attention_heads = 2;
    c.num_query_groups = llama ? 1 : 0;
    c.kv_channels = 0;
    c.ffn_hidden_size = llama ? 256 : 0;
    c.seq_length = 80;
    c.max_position_embeddings = 96;
    c.init_method_std = 0.05;
    c.attention_dropout = 0.1;
    c.finalize();
    ASSERT_EQ(c.head_dim(), 64);
    const ForwardMode mode{true, 99, 3};
    const DeviceRun gpu = run_on(c, Device::kCUDA, DType::kBF16, mode);
    const DeviceRun cpu = run_on(c, Device::kCPU, DType::kBF16, mode);
    double worst = 0;
    for (const auto& [name, g] : cpu.grads) {
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < g.numel(); ++i) {
        scale = std::max(scale, std::fabs(g.item(i)));
        diff = std::max(diff, std::fabs(gpu.grads.at(name).item(i) - g.item(i)));
      }
      worst = std::max(worst, diff / scale);
    }
    std::printf(
        "%s bf16: loss GPU %.6f CPU %.6f; largest gradient difference %.2e of the "
        "parameter's largest gradient\n",
        llama ? "llama" : "gpt2", gpu.loss, cpu.loss, worst);
    expect_same_run(gpu, cpu, 5e-2, llama ? "llama cuda bf16" : "gpt2 cuda bf16");
  }
}

}  // namespace
}  // namespace megatron
