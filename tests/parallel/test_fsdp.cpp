// Megatron-FSDP's pieces under a real MPI job (CTest runs this binary with 2 and 4 processes, the
// world as the data-parallel group): the per-unit bucket layout, sharded storage, and the
// runtime that lends gathered weights and gradient buffers (parallel/fsdp.h).
//
// Values are exact: weights are k / 8 with small integer k, and rank r's gradient of element i in
// micro-batch m is (r + 1 + m) * k_i / 4. With dp = 2 or 4, scaling by 1/dp is exact and every
// partial sum is a small multiple of 1/(4 dp), so the reduce-scattered mean is exact in any order
// and is compared bit for bit with its closed form.
//
// Every rank runs the same calls in the same order (collectives pair up); checks use EXPECT, and
// ASSERT only on facts that are the same on every rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/process_group.h"
#include "optim/distributed_optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "tensor/tensor.h"
#include "testing/mpi_testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

ProcessGroup& world() {
  return *g_runtime->world();
}

// Registration order (forward order): the embeddings, two layers of two parameters, a final
// norm. Laid out reversed, so the final norm's unit is bucket 0.
struct Spec {
  std::string name;
  int64_t numel;
  bool embedding = false;
};
const std::vector<Spec> kSpecs = {
    {"embedding.word_embeddings.weight", 37, true},
    {"decoder.layers.0.self_attention.linear_qkv.weight", 21},
    {"decoder.layers.0.mlp.linear_fc1.bias", 5},
    {"decoder.layers.1.self_attention.linear_qkv.weight", 21},
    {"decoder.layers.1.mlp.linear_fc1.bias", 5},
    {"decoder.final_layernorm.weight", 9},
};

double weight_value(const Param& p, int64_t i) {
  return static_cast<double>((static_cast<int64_t>(p.name.size()) * 7 + i * 3) % 17 - 8) / 8.0;
}

double grad_value(int rank, int micro, int64_t i) {
  return static_cast<double>((rank + 1 + micro) * (i % 9 - 4)) / 4.0;
}

std::vector<double> values(const Tensor& t) {
  Tensor d = t.to(DType::kF64);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

// Shards the gradients (ZeRO-2), and the weights too (ZeRO-3), over the world.
Sharding over_world(bool weights) {
  Sharding s;
  s.grads = true;
  s.weights = weights;
  s.dense_rank = world().rank();
  s.dense_size = world().size();
  return s;
}

struct Model {
  explicit Model(bool bf16 = false, const Sharding& sharding = {})
      : params(make()), set(pointers(), dtype(bf16), layout(), Device::kCPU, sharding) {
    for (Param& p : params) {
      Tensor v = Tensor::empty(p.shape, DType::kF64);
      for (int64_t i = 0; i < p.shape.numel(); ++i) v.data<double>()[i] = weight_value(p, i);
      set.set_main(p, v.to(DType::kF32));
    }
    set.sync_compute_from_main();
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  static DType dtype(bool bf16) { return bf16 ? DType::kBF16 : DType::kF32; }
  static BucketLayout layout() {
    BucketLayout l = distributed_bucket_layout(0, world().size());
    l.per_unit = true;
    return l;
  }
  static std::vector<Param> make() {
    std::vector<Param> out(kSpecs.size());
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      out[i].name = kSpecs[i].name;
      out[i].shape = Shape{kSpecs[i].numel};
      out[i].is_embedding_or_output = kSpecs[i].embedding;
    }
    return out;
  }
  std::vector<Param*> pointers() {
    std::vector<Param*> out;
    for (Param& p : params) out.push_back(&p);
    return out;
  }
  std::vector<const Param*> unit(const std::string& prefix) const {
    std::vector<const Param*> out;
    for (const Param& p : params)
      if (p.name.rfind(prefix, 0) == 0) out.push_back(&p);
    return out;
  }

  std::vector<Param> params;
  ParamSet set;
};

TEST(Fsdp, UnitNames) {
  EXPECT_EQ(fsdp_unit("decoder.layers.12.mlp.linear_fc1.weight"), "decoder.layers.12");
  EXPECT_EQ(fsdp_unit("encoder.layers.0.self_attention.linear_qkv.bias"), "encoder.layers.0");
  EXPECT_EQ(fsdp_unit("embedding.word_embeddings.weight"), "embedding");
  EXPECT_EQ(fsdp_unit("embedding.position_embeddings.weight"), "embedding");
  EXPECT_EQ(fsdp_unit("decoder.final_layernorm.weight"), "decoder.final_layernorm");
  EXPECT_EQ(fsdp_unit("output_layer.weight"), "output_layer");
  // "layers" without a layer number is not a layer.
  EXPECT_EQ(fsdp_unit("layers.x.weight"), "layers.x");
}

TEST(Fsdp, OneBucketPerUnit) {
  Model m;
  // Reverse layout: final norm, layer 1, layer 0, embedding.
  ASSERT_EQ(m.set.bucket_ranges().size(), 4u);
  const std::vector<std::string> units = {"decoder.final_layernorm", "decoder.layers.1",
                                          "decoder.layers.0", "embedding"};
  for (int64_t b = 0; b < 4; ++b) {
    for (const Param* p : m.set.bucket_params(b)) EXPECT_EQ(fsdp_unit(p->name), units[b]);
    const auto [begin, end] = m.set.bucket_ranges()[static_cast<size_t>(b)];
    EXPECT_EQ((end - begin) % (16 * world().size()), 0) << "bucket " << b << " splits evenly";
  }
}

// ZeRO-3: weights appear only while lent, equal to the unsharded ones; gradients of two
// micro-batches are reduce-scattered into the shards as the mean over ranks of their sum.
TEST(Fsdp, LendsWeightsAndReducesGradientsIntoShards) {
  Model full;  // never sharded: the reference values
  Model m(false, over_world(true));
  GradBuckets buckets(m.set, world(), 0, false, GradReduce::kReduceScatter);
  FsdpRuntime fsdp(buckets);
  const int dp = world().size(), r = world().rank();
  for (const Param& p : m.params) {
    EXPECT_FALSE(p.value.defined()) << p.name;
    EXPECT_FALSE(p.main_grad.defined()) << p.name;
  }
  // The shards hold 1/dp of the buffers.
  const int64_t total = m.set.bucket_ranges().back().second;
  EXPECT_EQ(m.set.main().numel() * dp, total);
  EXPECT_EQ(m.set.grads().numel() * dp, total);

  const std::vector<std::string> order = {"embedding", "decoder.layers.0", "decoder.layers.1",
                                          "decoder.final_layernorm"};
  for (int micro = 0; micro < 2; ++micro) {
    for (const std::string& u : order) {  // forward
      const auto ps = m.unit(u);
      fsdp.wait_for(ps);
      for (size_t k = 0; k < ps.size(); ++k) {
        ASSERT_TRUE(ps[k]->value.defined());
        EXPECT_EQ(values(ps[k]->value), values(full.unit(u)[k]->value)) << ps[k]->name;
      }
      fsdp.release(ps);
      EXPECT_FALSE(ps.front()->value.defined()) << u << " dropped after its forward";
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {  // backward
      const auto ps = m.unit(*it);
      fsdp.before_backward(ps);
      for (const Param* p : ps) {
        ASSERT_TRUE(p->value.defined() && p->main_grad.defined()) << p->name;
        EXPECT_EQ(values(p->main_grad), std::vector<double>(p->shape.numel(), 0.0))
            << "a fresh buffer";
        Tensor g = Tensor::empty(p->shape, DType::kF64);
        for (int64_t i = 0; i < p->shape.numel(); ++i)
          g.data<double>()[i] = grad_value(r, micro, i);
        const_cast<Param*>(p)->main_grad.copy_from(g);
      }
      fsdp.after_backward(ps);
      EXPECT_FALSE(ps.front()->main_grad.defined()) << *it << " reduced and returned";
      EXPECT_FALSE(ps.front()->value.defined()) << *it << " dropped after its backward";
    }
  }
  fsdp.finish();
  // Mean over ranks of the two micro-batches' gradients, on this rank's shard of each bucket.
  for (int64_t b = 0; b < static_cast<int64_t>(m.set.bucket_ranges().size()); ++b) {
    const auto [s0, s1] = m.set.owned_range(b);
    Tensor shard = m.set.grad_shard(b).to(DType::kF64);
    for (const Param* p : m.set.bucket_params(b)) {
      const int64_t at = m.set.offset_of(*p);
      for (int64_t i = 0; i < p->shape.numel(); ++i) {
        const int64_t flat = at + i;
        if (flat < s0 || flat >= s1) continue;
        double want = 0;
        for (int q = 0; q < dp; ++q) want += grad_value(q, 0, i) + grad_value(q, 1, i);
        want /= dp;
        EXPECT_EQ(shard.data<double>()[flat - s0], want) << p->name << "[" << i << "]";
      }
    }
  }
  EXPECT_GT(fsdp.gathers(), 0);
}

// Initialisation straight into the shards gives each element the value the unsharded set gives it
// (the whole model is never allocated).
TEST(Fsdp, InitialisesTheShardsAsTheWholeModel) {
  std::vector<Param> whole = Model::make(), parts = Model::make();
  for (std::vector<Param>* ps : {&whole, &parts}) {
    for (Param& p : *ps) {
      p.init = p.name.find("bias") != std::string::npos ? Init::kZeros : Init::kNormal;
      if (p.name.find("norm") != std::string::npos) p.init = Init::kOnes;
    }
  }
  auto ptrs = [](std::vector<Param>& ps) {
    std::vector<Param*> out;
    for (Param& p : ps) out.push_back(&p);
    return out;
  };
  ParamSet a(ptrs(whole), DType::kBF16, Model::layout());
  ParamSet b(ptrs(parts), DType::kBF16, Model::layout(), Device::kCPU, over_world(true));
  a.initialize(1234);
  b.initialize(1234);
  const int64_t total = a.bucket_ranges().back().second;
  EXPECT_EQ(b.main().numel() * world().size(), total);
  EXPECT_EQ(b.compute().numel() * world().size(), total);
  int64_t checked = 0;
  for (const ParamSet::OwnedSegment& s : b.owned_segments()) {
    const Param& w = whole[static_cast<size_t>(s.param - parts.data())];
    const std::vector<double> want = values(w.main.flat_view(s.param_begin, {s.numel}));
    EXPECT_EQ(values(b.main().flat_view(s.at, {s.numel})), want) << w.name;
    EXPECT_EQ(values(b.compute().flat_view(s.at, {s.numel})),
              values(w.value.flat_view(s.param_begin, {s.numel})))
        << w.name;
    checked += s.numel;
  }
  // Every element of the model is on exactly one rank.
  Tensor n = Tensor::full({1}, static_cast<double>(checked), DType::kF64);
  world().all_reduce(n);
  int64_t model = 0;
  for (const Param& p : whole) model += p.shape.numel();
  EXPECT_EQ(n.data<double>()[0], static_cast<double>(model));
}

// A unit used by two modules (tied embeddings) stays gathered while either holds it.
TEST(Fsdp, NestedUsesKeepTheUnit) {
  Model m(false, over_world(true));
  GradBuckets buckets(m.set, world(), 0, false, GradReduce::kReduceScatter);
  FsdpRuntime fsdp(buckets);
  const auto emb = m.unit("embedding");
  fsdp.wait_for(emb);
  fsdp.wait_for(emb);
  fsdp.release(emb);
  EXPECT_TRUE(emb.front()->value.defined());
  fsdp.release(emb);
  EXPECT_FALSE(emb.front()->value.defined());
  // Backward: the output layer's begin opens the unit, the embedding's begin joins it, and the
  // gradient buffer is returned only when every parameter is reported.
  fsdp.before_backward(emb);
  fsdp.before_backward(emb);
  EXPECT_TRUE(emb.front()->main_grad.defined());
  fsdp.after_backward(emb);
  EXPECT_FALSE(emb.front()->main_grad.defined());
  fsdp.finish();
}

// ZeRO-2: weights stay whole (nothing gathered), only gradients are lent and sharded.
TEST(Fsdp, ShardedGradientsKeepWholeWeights) {
  Model m(/*bf16=*/true, over_world(false));
  GradBuckets buckets(m.set, world(), 0, false, GradReduce::kReduceScatter);
  FsdpRuntime fsdp(buckets);
  for (const Param& p : m.params) EXPECT_TRUE(p.value.defined() && p.main.defined()) << p.name;
  const auto l0 = m.unit("decoder.layers.0");
  fsdp.wait_for(l0);
  fsdp.release(l0);
  fsdp.before_backward(l0);
  EXPECT_TRUE(l0.front()->main_grad.defined());
  fsdp.after_backward(l0);
  fsdp.finish();
  EXPECT_EQ(fsdp.gathers(), 0);
  EXPECT_TRUE(l0.front()->value.defined());
  EXPECT_EQ(m.set.grads().numel() * world().size(), m.set.bucket_ranges().back().second);
}

// Whole fp32 main weights for a reader of the whole model (the Hugging Face export).
TEST(Fsdp, GatherMainAll) {
  Model full(/*bf16=*/true);
  Model m(/*bf16=*/true, over_world(true));
  GradBuckets buckets(m.set, world(), 0, false, GradReduce::kReduceScatter);
  DistributedOptimizer opt(buckets, AdamWConfig{});
  opt.gather_main_all();
  for (size_t k = 0; k < m.params.size(); ++k) {
    ASSERT_TRUE(m.params[k].main.defined());
    EXPECT_EQ(values(m.params[k].main), values(full.params[k].main)) << m.params[k].name;
  }
  opt.release_main_all();
  EXPECT_FALSE(m.params.front().main.defined());
}

// Mixed precision with the main weights sharded alone (Megatron's distributed-optimizer layout):
// 1/dp of the fp32 main weights, the whole bf16 compute copy, refreshed by an all-gather of the
// compute copy after a step; a frozen Param keeps a whole private copy.
TEST(Fsdp, MainWeightsShardedAlone) {
  Model full(/*bf16=*/true);
  Sharding main_only;
  main_only.main = true;
  main_only.dense_rank = world().rank();
  main_only.dense_size = world().size();
  std::vector<Param> ps = Model::make();
  ps.back().frozen = true;  // the final norm, as a router's expert bias would be
  std::vector<Param*> ptrs;
  for (Param& p : ps) ptrs.push_back(&p);
  ParamSet set(ptrs, DType::kBF16, Model::layout(), Device::kCPU, main_only);
  for (size_t k = 0; k < ps.size(); ++k) set.set_main(ps[k], full.params[k].main);
  set.sync_compute_from_main();
  const int64_t total = set.bucket_ranges().back().second;
  EXPECT_EQ(set.main().numel() * world().size(), total);
  EXPECT_EQ(set.compute().numel(), total);
  EXPECT_EQ(set.grads().numel(), total);
  EXPECT_TRUE(ps.back().main.defined() && ps.back().main.raw() != set.main().raw());
  for (size_t k = 0; k + 1 < ps.size(); ++k) EXPECT_FALSE(ps[k].main.defined()) << ps[k].name;
  GradBuckets buckets(set, world(), 0, false, GradReduce::kReduceScatter);
  DistributedOptimizer opt(buckets, AdamWConfig{});
  // Scramble the compute copy; a zero-rate step must bring every rank's back from the shards.
  set.compute().fill(7.0);
  for (Param& p : ps) {
    if (p.frozen) p.value.fill(7.0);
  }
  set.zero_grads();
  opt.step(0.0);
  opt.refresh_compute();
  for (size_t k = 0; k < ps.size(); ++k)
    EXPECT_EQ(values(ps[k].value), values(full.params[k].value)) << ps[k].name;
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
