// An MoE layer against a dense MLP of the same active FLOPs (Google Benchmark): forward and
// backward of MoELayer (8 SwiGLU experts of width 512, top-2: router GEMM, routing, permutation,
// the experts' grouped GEMMs, combine) and of the MLP (SwiGLU of width 2 x 512 = 1024, the FLOPs
// a token spends in its two experts), over s 256 x b 8 tokens of hidden 256, f32 and bf16.
// items/s are the active model FLOPs per second (the MLP GEMMs' 3 x 2 x 2 x tokens x h x ffn x 3/2
// of both); their ratio is the MoE layer's efficiency against the dense layer. No communication
// (one process). Timings only; correctness lives in tests/.
//
// BM_ExpertGemms: the experts' GEMMs alone, grouped against a matmul call per expert.
//
// Run: build/bench/bench_moe --benchmark_repetitions=8 --benchmark_enable_random_interleaving=true
//        --benchmark_min_time=0.5 --benchmark_report_aggregates_only=true
// (interleaved repetitions: on a shared 2-core machine the speed drifts by 10% within a minute).
#include <benchmark/benchmark.h>

#include "comm/process_group.h"
#include "core/philox.h"
#include "tensor/ops.h"
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

// The experts' six GEMMs of a forward and backward (fc1, fc2; their input and weight
// gradients), over 8 experts' uneven row blocks (4096 rows: 2 x s x b, top-2), as one grouped
// GEMM per kind (Arg 1) or as a matmul call per expert (Arg 0, what --moe-grouped-gemm replaces).
// Second Arg: bf16 (1) or f32 (0). Third: row counts that are multiples of 32 (0) or odd ones
// (1), as routing makes them.
void BM_ExpertGemms(benchmark::State& state) {
  const bool grouped = state.range(0) != 0;
  const DType dt = state.range(1) ? DType::kBF16 : DType::kF32;
  const std::vector<int64_t> counts =
      state.range(2) ? std::vector<int64_t>{449, 575, 513, 479, 545, 511, 481, 543}
                     : std::vector<int64_t>{448, 576, 512, 480, 544, 512, 480, 544};
  const int64_t N = 4096, f1 = 2 * kFfn;
  auto random = [](const Shape& s, uint64_t seed, DType t) {
    Tensor x = Tensor::empty(s, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = Philox::uniform(seed, 0, static_cast<uint64_t>(i)) - 0.5f;
    return x.to(t);
  };
  const Tensor x = random({N, kH}, 1, dt), act = random({N, kFfn}, 2, dt);
  const Tensor dy = random({N, kH}, 3, dt), dpre = random({N, f1}, 4, dt);
  std::vector<Tensor> w1, w2, g1, g2;
  for (int64_t e = 0; e < kExperts; ++e) {
    w1.push_back(random({f1, kH}, 10 + e, dt));
    w2.push_back(random({kH, kFfn}, 20 + e, dt));
    g1.push_back(Tensor::zeros({f1, kH}));
    g2.push_back(Tensor::zeros({kH, kFfn}));
  }
  Tensor pre = Tensor::empty({N, f1}), y = Tensor::empty({N, kH});
  Tensor dact = Tensor::empty({N, kFfn}), dx = Tensor::empty({N, kH});
  for (auto _ : state) {
    if (grouped) {
      ops::grouped_matmul(pre, x, w1, true, counts);
      ops::grouped_matmul(y, act, w2, true, counts);
      ops::grouped_matmul(dact, dy, w2, false, counts);
      ops::grouped_matmul_at(g2, dy, act, counts, 1.0f);
      ops::grouped_matmul(dx, dpre, w1, false, counts);
      ops::grouped_matmul_at(g1, dpre, x, counts, 1.0f);
    } else {
      int64_t at = 0;
      for (int64_t e = 0; e < kExperts; ++e) {
        const int64_t n = counts[static_cast<size_t>(e)];
        auto rows = [&](const Tensor& t) { return t.slice0(at, at + n); };
        Tensor o1 = rows(pre), o2 = rows(y), o3 = rows(dact), o4 = rows(dx);
        ops::matmul(o1, rows(x), false, w1[e], true);
        ops::matmul(o2, rows(act), false, w2[e], true);
        ops::matmul(o3, rows(dy), false, w2[e], false);
        ops::matmul(g2[e], rows(dy), true, rows(act), false, 1.0f);
        ops::matmul(o4, rows(dpre), false, w1[e], false);
        ops::matmul(g1[e], rows(dpre), true, rows(x), false, 1.0f);
        at += n;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * active_flops()));
}
BENCHMARK(BM_ExpertGemms)
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace megatron

BENCHMARK_MAIN();
