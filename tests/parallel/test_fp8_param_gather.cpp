// FP8 primary weights (--fp8-param-gather) under a real MPI job (CTest runs this binary with 2 and
// 4 processes, the world as the data-parallel group): the layout that keeps their codes in
// buckets of their own, the distributed optimizer's quantisation of the owned fp32 main weights
// into codes, and the all-gather that moves one byte per element.
//
// The expected codes are computed here, independently of the kernels: each weight rounded to
// bf16, times its scale, through the codec (core/fp8.h's fp8_encode, itself checked against the
// OCP specification in tests/core); the scale is delayed scaling's current one or, tensorwise,
// 448 over the whole weight's amax. Weights are multiples of 1/16 below 4 (exact in bf16), so
// every value is exact and every comparison bit for bit.
//
// Every rank runs the same calls in the same order (collectives pair up); checks use EXPECT, and
// ASSERT only on facts that are the same on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/process_group.h"
#include "core/fp8.h"
#include "optim/distributed_optimizer.h"
#include "parallel/fp8_scaling.h"
#include "parallel/fsdp.h"
#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "testing/mpi_testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

ProcessGroup& world() {
  return *g_runtime->world();
}

// Registration order: the embeddings, two layers (an FP8 GEMM weight and a bias each), a final
// norm.
struct Spec {
  std::string name;
  Shape shape;
  bool fp8 = false;
  bool embedding = false;
};
const std::vector<Spec> kSpecs = {
    {"embedding.word_embeddings.weight", Shape{37}, false, true},
    {"decoder.layers.0.self_attention.linear_qkv.weight", Shape{8, 16}, true},
    {"decoder.layers.0.self_attention.linear_qkv.bias", Shape{8}},
    {"decoder.layers.1.mlp.linear_fc1.weight", Shape{24, 16}, true},
    {"decoder.layers.1.mlp.linear_fc1.bias", Shape{24}},
    {"decoder.final_layernorm.weight", Shape{9}},
};

// Multiples of 1/16 in (-4, 4): exact in bf16, spread over several FP8 binades.
double weight_value(size_t param, int64_t i) {
  return static_cast<double>((static_cast<int64_t>(param) * 29 + i * 37) % 101 - 50) / 16.0;
}

struct Model {
  // fp8: the FP8 weights are primary (Param::fp8 set) under `recipe`.
  Model(bool fp8, Fp8Recipe recipe, const BucketLayout& layout, const Sharding& sharding) {
    Fp8Config cfg;
    cfg.mode = Fp8Mode::kHybrid;
    cfg.recipe = recipe;
    cfg.param_gather = fp8;
    params.resize(kSpecs.size());
    for (size_t k = 0; k < kSpecs.size(); ++k) {
      Param& p = params[k];
      p.name = kSpecs[k].name;
      p.shape = kSpecs[k].shape;
      p.is_embedding_or_output = kSpecs[k].embedding;
      if (kSpecs[k].fp8) {
        scaling.push_back(
            std::make_unique<Fp8GemmScaling>(p.name.substr(0, p.name.size() - 7), cfg, 0, 1));
        if (fp8) p.fp8 = scaling.back().get();
      }
    }
    std::vector<Param*> ptrs;
    for (Param& p : params) ptrs.push_back(&p);
    set = std::make_unique<ParamSet>(ptrs, DType::kBF16, layout, Device::kCPU, sharding);
    for (size_t k = 0; k < params.size(); ++k) {
      Tensor v = Tensor::empty(params[k].shape, DType::kF64);
      for (int64_t i = 0; i < v.numel(); ++i) v.data<double>()[i] = weight_value(k, i);
      set->set_main(params[k], v.to(DType::kF32));
    }
    set->sync_compute_from_main();
  }

  std::vector<Param> params;
  std::vector<std::unique_ptr<Fp8GemmScaling>> scaling;
  std::unique_ptr<ParamSet> set;
};

Sharding main_only() {
  Sharding s;
  s.main = true;
  s.dense_rank = world().rank();
  s.dense_size = world().size();
  return s;
}

Sharding zero3() {
  Sharding s;
  s.grads = s.weights = true;
  s.dense_rank = world().rank();
  s.dense_size = world().size();
  return s;
}

// Size-based buckets of at least this many elements (several per part), or one per FSDP unit.
constexpr int64_t kBucketSize = 200;

BucketLayout layout(bool per_unit) {
  BucketLayout l = distributed_bucket_layout(per_unit ? 0 : kBucketSize, world().size());
  l.per_unit = per_unit;
  return l;
}

// The codes the distributed optimizer must produce for Param k, and their scale.
std::vector<uint8_t> expected_codes(size_t k, Fp8Recipe recipe, float* scale) {
  const int64_t n = kSpecs[k].shape.numel();
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(weight_value(k, i)));
  // Delayed: the initial scale 1; tensorwise: fp8_max / amax of the whole weight; blockwise: the
  // largest power of two not above it (these weights are one 128 x 128 tile each).
  *scale = recipe == Fp8Recipe::kDelayed ? 1.0f : 448.0f / static_cast<float>(amax);
  if (recipe == Fp8Recipe::kBlockwise) {
    float p = 1.0f;
    while (p > *scale) p /= 2;
    while (2 * p <= *scale) p *= 2;
    *scale = p;
  }
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] =
        fp8_encode(static_cast<float>(weight_value(k, i)) * *scale, Fp8Format::kE4M3);
  return out;
}

std::vector<uint8_t> bytes(const Tensor& codes) {
  return std::vector<uint8_t>(codes.data<uint8_t>(), codes.data<uint8_t>() + codes.numel());
}

TEST(Fp8ParamGather, CodesSitInBucketsOfTheirOwnAfterEveryOtherParameter) {
  for (bool per_unit : {false, true}) {
    Model m(true, Fp8Recipe::kDelayed, layout(per_unit), main_only());
    const ParamSet& set = *m.set;
    const auto& ranges = set.bucket_ranges();
    ASSERT_TRUE(set.has_fp8_weights());
    for (int64_t b = 0; b < static_cast<int64_t>(ranges.size()); ++b) {
      for (const Param* p : set.bucket_params(b))
        EXPECT_EQ(p->fp8 != nullptr, set.fp8_bucket(b)) << p->name << " in bucket " << b;
    }
    // Each part in reverse registration order: layer 1's weight before layer 0's.
    EXPECT_LT(set.offset_of(m.params[3]), set.offset_of(m.params[1]));
    EXPECT_GE(set.offset_of(m.params[1]), set.offset_of(m.params[0]));
    // Storage: one byte per element of the FP8 buckets, the bf16 copy only of the others.
    const int64_t fp8_begin = ranges[static_cast<size_t>(set.first_fp8_bucket())].first;
    EXPECT_EQ(m.set->codes().numel(), ranges.back().second - fp8_begin);
    EXPECT_EQ(m.set->compute().numel(), fp8_begin);
    EXPECT_EQ(m.params[1].value.dtype(), DType::kU8);
    EXPECT_EQ(m.params[2].value.dtype(), DType::kBF16);
  }
  // Without FP8 primary weights the layout is the plain one: no FP8 bucket, no codes.
  Model plain(false, Fp8Recipe::kDelayed, layout(true), main_only());
  EXPECT_FALSE(plain.set->has_fp8_weights());
  EXPECT_FALSE(plain.set->codes().defined());
}

// ZeRO-1 with bf16 (the main weights sharded, the compute copy whole): refresh_compute quantises
// each rank's shards and all-gathers the codes; every rank ends with every weight's codes.
// Blockwise: the weights' tile amaxes are reduced over the ranks whose shards cut them, and the
// decoded weight carries the tile's factor (scale_inv 1).
TEST(Fp8ParamGather, DistributedOptimizerQuantisesShardsAndGathersCodes) {
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kTensorwise, Fp8Recipe::kBlockwise}) {
    Model m(true, recipe, layout(false), main_only());
    GradBuckets buckets(*m.set, world(), kBucketSize, false, GradReduce::kReduceScatter);
    DistributedOptimizer opt(buckets, AdamWConfig{});
    const int64_t sent0 = world().bytes_sent();
    opt.refresh_compute();
    const int64_t sent = world().bytes_sent() - sent0;
    for (size_t k = 0; k < kSpecs.size(); ++k) {
      if (!kSpecs[k].fp8) continue;
      float scale = 0;
      const std::vector<uint8_t> want = expected_codes(k, recipe, &scale);
      EXPECT_EQ(bytes(m.params[k].value), want) << m.params[k].name;
      const Fp8Tensor w = m.params[k].fp8->weight(m.params[k]);
      const bool tiled = recipe == Fp8Recipe::kBlockwise;
      EXPECT_EQ(w.scale_inv, tiled ? 1.0f : 1.0f / scale) << m.params[k].name;
      for (int64_t i = 0; i < w.q.numel(); ++i) {
        const double code_value = fp8_decode(want[static_cast<size_t>(i)], Fp8Format::kE4M3);
        ASSERT_EQ(w.q.item(i), tiled ? code_value / scale : code_value)
            << m.params[k].name << " element " << i;
      }
      if (recipe == Fp8Recipe::kDelayed) {
        // The whole weight's amax recorded as the step's weight amax (column 1 of row 0).
        double amax = 0;
        for (int64_t i = 0; i < kSpecs[k].shape.numel(); ++i)
          amax = std::fmax(amax, std::fabs(weight_value(k, i)));
        EXPECT_EQ(m.params[k].fp8->state()[1]->main.item(1), amax) << m.params[k].name;
      }
    }
    // The other parameters' bf16 copy is gathered as before.
    EXPECT_EQ(m.params[2].value.item(3), weight_value(2, 3));
    // Traffic, as ProcessGroup counts it ((W-1)/W of each all-gather's bytes, 2 (W-1)/W of an
    // all-reduce's): one byte per element of the FP8 buckets, two of the others, and one f32
    // amax per FP8 weight.
    const int64_t w = world().size();
    int64_t want = 0;
    for (int64_t b = 0; b < buckets.num_buckets(); ++b) {
      const auto [b0, b1] = m.set->bucket_ranges()[static_cast<size_t>(b)];
      want += (b1 - b0) * (m.set->fp8_bucket(b) ? 1 : 2) * (w - 1) / w;
    }
    want += static_cast<int64_t>(2 * 4 * 2 * static_cast<double>(w - 1) / static_cast<double>(w));
    EXPECT_EQ(sent, want);
  }
}

// ZeRO-3: the codes stay sharded; the FSDP runtime gathers a unit's (its bf16 bucket and its FP8
// bucket together) around its use.
TEST(Fp8ParamGather, FsdpGathersAUnitsCodesAroundItsUse) {
  Model m(true, Fp8Recipe::kTensorwise, layout(true), zero3());
  GradBuckets buckets(*m.set, world(), 0, false, GradReduce::kReduceScatter);
  DistributedOptimizer opt(buckets, AdamWConfig{});
  opt.refresh_compute();
  FsdpRuntime fsdp(buckets);
  // Shards only: 1/dp of the codes on each rank.
  const int64_t codes_total =
      m.set->bucket_ranges().back().second -
      m.set->bucket_ranges()[static_cast<size_t>(m.set->first_fp8_bucket())].first;
  EXPECT_EQ(m.set->codes().numel() * world().size(), codes_total);
  // Forward order: layer 0 (its bf16 bucket and its FP8 bucket), then layer 1.
  const std::vector<const Param*> layer0 = {&m.params[1], &m.params[2]};
  const std::vector<const Param*> layer1 = {&m.params[3], &m.params[4]};
  float scale = 0;
  fsdp.wait_for(layer0);
  EXPECT_EQ(bytes(m.params[1].value), expected_codes(1, Fp8Recipe::kTensorwise, &scale));
  EXPECT_EQ(m.params[2].value.item(5), weight_value(2, 5));
  EXPECT_EQ(fsdp.gathers(), 2 + 2);  // layer 0's two buckets, and layer 1's two prefetched
  fsdp.release(layer0);
  EXPECT_FALSE(m.params[1].value.defined());
  fsdp.wait_for(layer1);
  EXPECT_EQ(bytes(m.params[3].value), expected_codes(3, Fp8Recipe::kTensorwise, &scale));
  EXPECT_EQ(fsdp.gathers(), 4 + 1);  // the final norm's unit prefetched, nothing gathered again
  fsdp.release(layer1);
  fsdp.finish();
}

// A step changes the codes as it changes the weights: after a zero-rate step with a zero gradient
// the codes are what they were; every rank holds the same ones.
TEST(Fp8ParamGather, StepRequantisesTheSameCodesOnEveryRank) {
  Model m(true, Fp8Recipe::kDelayed, layout(false), main_only());
  GradBuckets buckets(*m.set, world(), kBucketSize, false, GradReduce::kReduceScatter);
  DistributedOptimizer opt(buckets, AdamWConfig{});
  opt.refresh_compute();
  const std::vector<uint8_t> before = bytes(m.params[3].value);
  m.set->codes().zero();
  m.set->zero_grads();
  opt.step(0.0);
  EXPECT_EQ(bytes(m.params[3].value), before);
  Tensor all = Tensor::empty({world().size() * m.params[3].value.numel()}, DType::kU8);
  world().all_gather(all, m.params[3].value.clone());
  for (int r = 0; r < world().size(); ++r) {
    EXPECT_EQ(bytes(all.flat_view(r * m.params[3].value.numel(), {m.params[3].value.numel()})),
              before)
        << "rank " << r;
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
}
