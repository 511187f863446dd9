// An MoE layer against a dense MLP of the same active FLOPs (Google Benchmark): forward and
// backward of MoELayer (8 SwiGLU experts of width 512, top-2: router GEMM, routing, permutation,
// the experts' grouped GEMMs, combine) and of the MLP (SwiGLU of width 2 x 512 = 1024, the FLOPs
// a token spends in its two experts), over s 256 x b 8 tokens of hidden 256, f32 and bf16.
// items/s are the active model FLOPs per second (the MLP GEMMs' 3 x 2 x 2 x tokens x h x ffn x 3/2
// of both); their ratio is the MoE layer's efficiency against the dense layer. No communication
// (one process). Timings only; correctness lives in tests/.
//
// Run: build/bench/bench_moe [--benchmark_filter=Moe]
#include <benchmark/benchmark.h>

#include "comm/process_group.h"
#include "core/philox.h"
#include "transformer/mlp.h"
#include "transformer/moe/moe_layer.h"

namespace megatron {
namespace {

constexpr int64_t kS = 256, kB = 8, kH = 256, kExperts = 8, kTopK = 2, kFfn = 512;

TransformerConfig config(DType dt, bool moe) {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = kH;
  c.num_attention_heads = 4;
  c.seq_length = kS;
  c.vocab_size = 128;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.normalization = Normalization::kRMSNorm;
  c.compute_dtype = dt;
  c.ffn_hidden_size = kTopK * kFfn;
  if (moe) {
    c.moe.num_experts = kExperts;
    c.moe.router_topk = kTopK;
    c.moe.ffn_hidden_size = kFfn;
    c.moe.aux_loss_coeff = {1e-2};  // the aux loss's routing pass is part of the layer's cost
  }
  c.finalize();
  return c;
}

Tensor random_input() {
  Tensor t = Tensor::empty({kS, kB, kH}, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = Philox::uniform(1, 2, static_cast<uint64_t>(i)) - 0.5f;
  return t;
}

// Active FLOPs of one forward + backward of the MLP (or of a token's k experts).
double active_flops() {
  return 3.0 * 2.0 * 2.0 * static_cast<double>(kS * kB) * kH * (kTopK * kFfn) * 1.5;
}

void BM_DenseMlp(benchmark::State& state) {
  const DType dt = state.range(0) ? DType::kBF16 : DType::kF32;
  const TransformerConfig cfg = config(dt, false);
  auto self = make_self_process_group();
  MLP mlp("mlp", cfg, TensorParallelContext{self.get(), false, {}});
  std::vector<Param*> ps;
  mlp.collect(ps);
  ParamSet set(ps, dt);
  set.initialize(7);
  const Tensor x = random_input(), dy = random_input();
  for (auto _ : state) {
    MLP::Ctx ctx;
    benchmark::DoNotOptimize(mlp.forward(x, ctx));
    benchmark::DoNotOptimize(mlp.backward(dy, ctx));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * active_flops()));
}
BENCHMARK(BM_DenseMlp)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MoeLayer(benchmark::State& state) {
  const DType dt = state.range(0) ? DType::kBF16 : DType::kF32;
  const TransformerConfig cfg = config(dt, true);
  auto self = make_self_process_group();
  MoELayer moe("mlp", cfg, 0, TensorParallelContext{self.get(), false, {}});
  std::vector<Param*> ps;
  moe.collect(ps);
  ParamSet set(ps, dt);
  set.initialize(7);
  const Tensor x = random_input(), dy = random_input();
  ForwardMode mode;
  mode.training = true;
  mode.aux_loss_scale = 1.0;
  for (auto _ : state) {
    MoELayer::Ctx ctx;
    benchmark::DoNotOptimize(moe.forward(x, ctx, mode));
    benchmark::DoNotOptimize(moe.backward(dy, ctx));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * active_flops()));
}
BENCHMARK(BM_MoeLayer)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace megatron

BENCHMARK_MAIN();
