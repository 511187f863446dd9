// The language-model parts of models/common, one at a time in fp64, without tensor parallelism
// (test_common_parallel.cpp has the parallel layouts): LanguageEmbedding (learned positions,
// token types, dropout; RoPE configs without a position table), LMHead (untied, tied to the
// embedding, and the pipeline's tied copy) and Pooler. Each: its values against the formula
// written out with the fp64 reference ops, and its backward by finite differences
// (testing/layer_gradients.h has the check and its tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "models/common/language_embedding.h"
#include "models/common/lm_head.h"
#include "models/common/pooler.h"
#include "tensor/ops.h"
#include "tensor/reference/reference.h"
#include "testing/layer_gradients.h"
#include "testing/testing.h"

namespace megatron {
namespace {

constexpr int64_t kS = 5, kB = 2, kH = 6;

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = kH;
  c.num_attention_heads = 2;
  c.seq_length = kS;
  c.max_position_embeddings = 7;  // rows 5, 6 never used: zero gradient
  c.vocab_size = 13;
  c.padded_vocab_size = 16;  // rows 13..15 are padding
  c.hidden_dropout = 0;
  c.init_method_std = 0.4;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.finalize();
  return c;
}

struct SelfGroup {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TensorParallelContext tp() const { return TensorParallelContext{group.get(), false, {}}; }
};

// [b, s] i64 ids in [0, n).
Tensor ids(uint64_t seed, int64_t n) {
  return testing::random_ids({kB, kS}, seed, n);
}

// Initialised fp64 parameters (the values the reference formulas read).
std::unique_ptr<ParamSet> initialise(const std::vector<Param*>& ps, uint64_t seed) {
  auto params = std::make_unique<ParamSet>(ps, DType::kF64);
  params->initialize(seed);
  params->sync_compute_from_main();
  return params;
}

TEST(LanguageEmbedding, WordPositionAndTokenTypeRowsSummed) {
  SelfGroup g;
  const TransformerConfig cfg = config();
  LanguageEmbedding emb(cfg, g.tp(), /*num_tokentypes=*/3);
  std::vector<Param*> ps;
  emb.collect(ps);
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(emb.tokentype_embeddings.name, "embedding.tokentype_embeddings.weight");
  EXPECT_EQ(emb.tokentype_embeddings.shape, (Shape{3, kH}));
  const std::unique_ptr<ParamSet> params = initialise(ps, 5);

  const Tensor tokens = ids(1, cfg.vocab_size), types = ids(2, 3);
  Tensor positions = ids(3, cfg.max_position_embeddings);
  LanguageEmbedding::Ctx ctx;
  const Tensor y = emb.forward(tokens, positions, types, ctx, ForwardMode{});
  ASSERT_EQ(y.shape(), (Shape{kS, kB, kH}));
  // y[t, i] = W[token] + P[position] + T[type] of sequence i at t ([b, s] in, [s, b] out).
  Tensor want = Tensor::empty({kS, kB, kH}, DType::kF64);
  for (int64_t t = 0; t < kS; ++t)
    for (int64_t i = 0; i < kB; ++i)
      for (int64_t j = 0; j < kH; ++j) {
        const int64_t bs = i * kS + t;
        want.data<double>()[(t * kB + i) * kH + j] =
            emb.word_embeddings.main.item(tokens.data<int64_t>()[bs] * kH + j) +
            emb.position_embeddings.main.item(positions.data<int64_t>()[bs] * kH + j) +
            emb.tokentype_embeddings.main.item(types.data<int64_t>()[bs] * kH + j);
      }
  EXPECT_TRUE(testing::allclose(y, want, 0, 1e-15));

  // Token types are required exactly when the model has them.
  LanguageEmbedding plain(cfg, g.tp());
  EXPECT_THROW(plain.forward(tokens, Tensor(), types, ctx, ForwardMode{}), InvalidArgument);
  EXPECT_THROW(emb.forward(tokens, Tensor(), Tensor(), ctx, ForwardMode{}), InvalidArgument);
}

TEST(LanguageEmbedding, GradientsWithTokenTypesAndDropout) {
  SelfGroup g;
  TransformerConfig cfg = config();
  cfg.hidden_dropout = 0.2;
  const ForwardMode training{true, 7, 3};
  LanguageEmbedding emb(cfg, g.tp(), 2);
  LanguageEmbedding::Ctx ctx;
  std::vector<Param*> ps;
  emb.collect(ps);
  const Tensor types = ids(4, 2);
  // The input is the token ids (not differentiable): the three tables are checked.
  testing::check_layer_gradients({ps,
                                  [&](const Tensor& tokens) {
                                    ctx = {};
                                    return emb.forward(tokens, Tensor(), types, ctx, training);
                                  },
                                  [&](const Tensor& dy) {
                                    emb.backward(dy, ctx);
                                    return Tensor();
                                  }},
                                 ids(5, cfg.vocab_size), 21);
}

TEST(LanguageEmbedding, RopeModelsHaveNoPositionTable) {
  SelfGroup g;
  TransformerConfig cfg = config();
  cfg.position_embedding = PositionEmbedding::kRope;
  LanguageEmbedding emb(cfg, g.tp());
  std::vector<Param*> ps;
  emb.collect(ps);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0]->name, "embedding.word_embeddings.weight");
  EXPECT_EQ(ps[0]->shape, (Shape{16, kH}));
}

// Per-token loss of hidden [s, b, h] against weight [Vp, h]: log-sum-exp over the first
// vocab_size logits minus the target's, from the reference GEMM and cross entropy.
Tensor reference_loss(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                      int64_t vocab) {
  const Tensor logits = ref::matmul(hidden.view({kS * kB, kH}), false, weight, true);
  Tensor targets = transpose_bs(labels);
  const Tensor loss_sb = ref::cross_entropy(logits, targets.view({kS * kB}), vocab);
  return transpose_bs(loss_sb.view({kS, kB}));
}

TEST(LMHead, LossIsTheMaskedCrossEntropyOfTheLogits) {
  SelfGroup g;
  TransformerConfig cfg = config();
  cfg.untie_embeddings_and_output_weights = true;
  LMHead head(cfg, g.tp(), nullptr);
  EXPECT_EQ(head.own_weight.name, "output_layer.weight");
  EXPECT_FALSE(head.holds_embedding_copy());
  const std::unique_ptr<ParamSet> params = initialise({&head.own_weight}, 6);
  const Tensor hidden = testing::random_tensor({kS, kB, kH}, 8, 1.0, DType::kF64);
  const Tensor labels = ids(9, cfg.vocab_size);
  LMHead::Ctx ctx;
  const Tensor loss = head.loss(hidden, labels, ctx);
  ASSERT_EQ(loss.shape(), (Shape{kB, kS}));
  EXPECT_TRUE(testing::allclose(
      loss, reference_loss(hidden, head.own_weight.main, labels, cfg.vocab_size), 0, 1e-12));
  // Padding rows never receive probability: making them huge changes nothing.
  for (int64_t r = cfg.vocab_size; r < cfg.padded_vocab_size; ++r)
    for (int64_t j = 0; j < kH; ++j) head.own_weight.main.data<double>()[r * kH + j] = 50;
  params->sync_compute_from_main();
  LMHead::Ctx again;
  EXPECT_TRUE(testing::allclose(head.loss(hidden, labels, again), loss, 0, 0));
}

TEST(LMHead, GradientsUntiedTiedAndTheTiedCopy) {
  SelfGroup g;
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "untied" : mode == 1 ? "tied to the embedding" : "tied copy");
    TransformerConfig cfg = config();
    cfg.untie_embeddings_and_output_weights = mode == 0;
    LanguageEmbedding emb(cfg, g.tp());
    LMHead head(cfg, g.tp(), mode == 1 ? &emb.word_embeddings : nullptr);
    std::vector<Param*> ps;
    if (mode == 1) {
      ps.push_back(&emb.word_embeddings);
      EXPECT_TRUE(head.own_weight.name.empty());
      EXPECT_EQ(&head.weight(), &emb.word_embeddings);
    } else {
      ps.push_back(&head.own_weight);
    }
    if (mode == 2) {
      EXPECT_EQ(head.own_weight.name, "embedding.word_embeddings.weight");
      EXPECT_TRUE(head.holds_embedding_copy());
    }
    const Tensor labels = ids(10, cfg.vocab_size);
    LMHead::Ctx ctx;
    testing::check_layer_gradients(
        {ps,
         [&](const Tensor& hidden) {
           ctx = {};
           return head.loss(hidden, labels, ctx);
         },
         [&](const Tensor& dloss) { return head.loss_backward(dloss, ctx); }},
        testing::random_tensor({kS, kB, kH}, 11, 1.0, DType::kF64), 22 + mode);
  }
}

TEST(Pooler, TanhOfTheDenseLayerAtTheFirstPosition) {
  SelfGroup g;
  for (int64_t index : {0, 3}) {
    SCOPED_TRACE(index);
    Pooler pooler("pooler", kH, 0.4, g.tp(), index);
    std::vector<Param*> ps;
    pooler.collect(ps);
    ASSERT_EQ(ps.size(), 2u);
    EXPECT_EQ(ps[0]->name, "pooler.dense.weight");
    EXPECT_EQ(ps[1]->name, "pooler.dense.bias");
    const std::unique_ptr<ParamSet> params = initialise(ps, 12);
    ops::add_inplace(pooler.dense.bias.main,
                     testing::random_tensor({kH}, 13, 0.3, DType::kF64));  // not all zeros
    params->sync_compute_from_main();
    const Tensor hidden = testing::random_tensor({kS, kB, kH}, 14, 1.0, DType::kF64);
    Pooler::Ctx ctx;
    const Tensor y = pooler.forward(hidden, ctx);
    ASSERT_EQ(y.shape(), (Shape{kB, kH}));
    const Tensor x0 = hidden.view({kS * kB, kH}).slice0(index * kB, (index + 1) * kB).clone();
    Tensor z = ref::matmul(x0, false, pooler.dense.weight.main, true);
    for (int64_t i = 0; i < z.numel(); ++i)
      z.data<double>()[i] += pooler.dense.bias.main.item(i % kH);
    EXPECT_TRUE(testing::allclose(y, ref::tanh(z), 0, 1e-14));
    // Only the pooled position receives gradient.
    const Tensor dx = pooler.backward(testing::random_tensor({kB, kH}, 15, 1.0, DType::kF64), ctx);
    ASSERT_EQ(dx.shape(), (Shape{kS, kB, kH}));
    for (int64_t r = 0; r < kS * kB; ++r)
      for (int64_t j = 0; j < kH; ++j) {
        if (r / kB != index) {
          EXPECT_EQ(dx.item(r * kH + j), 0.0) << "row " << r;
        }
      }
  }
}

TEST(Pooler, Gradients) {
  SelfGroup g;
  Pooler pooler("pooler", kH, 0.4, g.tp(), 1);
  Pooler::Ctx ctx;
  std::vector<Param*> ps;
  pooler.collect(ps);
  testing::check_layer_gradients({ps,
                                  [&](const Tensor& hidden) {
                                    ctx = {};
                                    return pooler.forward(hidden, ctx);
                                  },
                                  [&](const Tensor& dy) { return pooler.backward(dy, ctx); }},
                                 testing::random_tensor({kS, kB, kH}, 16, 1.0, DType::kF64), 25);
}

}  // namespace
}  // namespace megatron
