// Micro-benchmarks of the CPU kernels (Google Benchmark) at the shapes of the benchmark model
// "config a" (hidden 256, 4 heads, seq 256, micro-batch 8, vocab 50304): where a training step's
// time goes, kernel by kernel. Timings only; correctness lives in tests/.
//
// Run: build/bench/bench_ops [--benchmark_filter=Attention]
#include <benchmark/benchmark.h>
#include <algorithm>

#include <cmath>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "optim/moment_storage.h"
#include "optim/muon.h"
#include "tensor/cpu/gemm.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

constexpr int64_t kS = 256, kB = 8, kH = 256, kHeads = 4, kVocab = 50304;

Tensor random(const Shape& shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = Philox::uniform(1, 2, static_cast<uint64_t>(i)) - 0.5f;
  return dtype == DType::kF32 ? t : t.to(dtype);
}

void BM_LinearForward(benchmark::State& state) {
  const DType dt = state.range(0) ? DType::kBF16 : DType::kF32;
  Tensor x = random({kS * kB, kH}, dt), w = random({4 * kH, kH}, dt),
         y = Tensor::empty({kS * kB, 4 * kH});
  for (auto _ : state) ops::matmul(y, x, false, w, true);
  state.SetItemsProcessed(state.iterations() * 2 * kS * kB * kH * 4 * kH);  // FLOPs
}
BENCHMARK(BM_LinearForward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The output layer's three GEMMs: logits = x w^T (0), dx = dlogits w (1), dw += dlogits^T x (2).
void BM_OutputLayer(benchmark::State& state) {
  const int64_t n = kS * kB;
  Tensor x = random({n, kH}), w = random({kVocab, kH}), logits = random({n, kVocab});
  Tensor dx = Tensor::empty({n, kH}), dw = Tensor::zeros({kVocab, kH});
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0:
        ops::matmul(logits, x, false, w, true);
        break;
      case 1:
        ops::matmul(dx, logits, false, w, false);
        break;
      default:
        ops::matmul(dw, logits, true, x, false, 1.0f);
        break;
    }
  }
  state.SetItemsProcessed(state.iterations() * 2 * n * kH * kVocab);
}
BENCHMARK(BM_OutputLayer)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

void BM_CrossEntropyForwardBackward(benchmark::State& state) {
  Tensor logits = random({kS * kB, kVocab}), loss = Tensor::empty({kS * kB}),
         lse = Tensor::empty({kS * kB});
  Tensor targets = Tensor::zeros({kS * kB}, DType::kI64), dloss = Tensor::full({kS * kB}, 1.0);
  Tensor dlogits = Tensor::empty(logits.shape());
  for (auto _ : state) {
    ops::cross_entropy_forward(loss, lse, logits, targets, kVocab);
    ops::cross_entropy_backward(dlogits, dloss, logits, lse, targets, kVocab);
  }
  state.SetBytesProcessed(state.iterations() * 3 * logits.nbytes());
}
BENCHMARK(BM_CrossEntropyForwardBackward)->Unit(benchmark::kMillisecond);

// Arguments: forward (0) or backward (1); the run's precision f32 (0) or bf16 (1: bf16 tiles where
// the CPU has AVX-512 BF16).
void BM_Attention(benchmark::State& state) {
  const bool backward = state.range(0);
  const int64_t hn = kH / kHeads;
  ops::AttentionSpec spec;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(hn));
  spec.precision = state.range(1) ? DType::kBF16 : DType::kF32;
  Tensor qkv = random({kS, kB, kHeads, 3, hn}), out = Tensor::empty({kS, kB, kHeads, hn});
  Tensor lse = Tensor::empty({kB, kHeads, kS}), dqkv = Tensor::empty(qkv.shape());
  using ops::packed_qkv_view, ops::QkvPart;
  const auto q = packed_qkv_view(qkv, QkvPart::kQuery), k = packed_qkv_view(qkv, QkvPart::kKey),
             v = packed_qkv_view(qkv, QkvPart::kValue);
  const auto dq = packed_qkv_view(dqkv, QkvPart::kQuery), dk = packed_qkv_view(dqkv, QkvPart::kKey),
             dv = packed_qkv_view(dqkv, QkvPart::kValue);
  ops::attention_forward(out, lse, q, k, v, spec);
  for (auto _ : state) {
    if (backward)
      ops::attention_backward(dq, dk, dv, Tensor(), out, q, k, v, out, lse, spec);
    else
      ops::attention_forward(out, lse, q, k, v, spec);
  }
  // Causal: half of the s x s scores; 2 GEMM-like products forward, 4 backward (+ recompute).
  state.SetItemsProcessed(state.iterations() * (backward ? 5 : 2) * kB * kHeads * kS * kS * hn);
}
BENCHMARK(BM_Attention)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond);

// gpt-oss's layers at a long sequence: causal attention over 4096 positions, full (window -1) or
// with a sliding window of 128 or 1024 keys (--window-size W,0), plus the sinks; forward and
// backward. The window skips the key tiles before it, so the time should follow the visible
// (query, key) pairs, counted as the items.
void BM_AttentionWindow(benchmark::State& state) {
  constexpr int64_t s = 4096, heads = 4, hn = 64;
  const int64_t window = state.range(0);
  ops::AttentionSpec spec;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(hn));
  spec.window = window;
  Tensor qkv = random({s, 1, heads, 3, hn}), out = Tensor::empty({s, 1, heads, hn});
  Tensor lse = Tensor::empty({1, heads, s}), dqkv = Tensor::empty(qkv.shape());
  const Tensor sink = random({heads});
  Tensor dsink = Tensor::empty({heads});
  using ops::packed_qkv_view, ops::QkvPart;
  const auto q = packed_qkv_view(qkv, QkvPart::kQuery), k = packed_qkv_view(qkv, QkvPart::kKey),
             v = packed_qkv_view(qkv, QkvPart::kValue);
  const auto dq = packed_qkv_view(dqkv, QkvPart::kQuery), dk = packed_qkv_view(dqkv, QkvPart::kKey),
             dv = packed_qkv_view(dqkv, QkvPart::kValue);
  for (auto _ : state) {
    ops::attention_forward(out, lse, q, k, v, spec);
    ops::attention_sink_forward(out, lse, sink);
    ops::attention_sink_backward(dsink, out, out, lse, sink);
    ops::attention_backward(dq, dk, dv, Tensor(), out, q, k, v, out, lse, spec);
  }
  int64_t pairs = 0;  // visible (query, key) pairs
  for (int64_t i = 0; i < s; ++i) pairs += window < 0 ? i + 1 : std::min(i, window) + 1;
  state.SetItemsProcessed(state.iterations() * heads * pairs);
}
BENCHMARK(BM_AttentionWindow)->Arg(-1)->Arg(1024)->Arg(128)->Unit(benchmark::kMillisecond);

// Muon's Newton-Schulz (optim/muon.h) on a [768, 3072] matrix (GPT-2's fc1/fc2 shape): five
// quintic steps, bf16 (arg 1, --muon-fp32-matmul-prec medium) or f32 (arg 0). FLOPs per call:
// 5 x (4 m^2 n + 2 m^3) with m = 768, n = 3072. bench/muon_pytorch.py times PyTorch on the same.
void BM_NewtonSchulz(benchmark::State& state) {
  constexpr int64_t m = 768, n = 3072;
  const Tensor x = random({m, n});
  const auto coefficients = muon_coefficients("quintic", 5);
  for (auto _ : state)
    benchmark::DoNotOptimize(newton_schulz(x, coefficients, false, state.range(0)));
  state.counters["GFLOP/s"] = benchmark::Counter(
      5.0 * (4.0 * m * m * n + 2.0 * m * m * m) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NewtonSchulz)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNormForwardBackward(benchmark::State& state) {
  Tensor x = random({kS * kB, kH}), w = random({kH}), b = random({kH}),
         y = Tensor::empty(x.shape());
  Tensor mean = Tensor::empty({kS * kB}), rstd = Tensor::empty({kS * kB}),
         dx = Tensor::empty(x.shape());
  Tensor dw = Tensor::zeros({kH}), db = Tensor::zeros({kH});
  for (auto _ : state) {
    ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
    ops::layernorm_backward(dx, dw, db, y, x, w, mean, rstd);
  }
  state.SetBytesProcessed(state.iterations() * 5 * x.nbytes());
}
BENCHMARK(BM_LayerNormForwardBackward)->Unit(benchmark::kMicrosecond);

void BM_GeluForwardBackward(benchmark::State& state) {
  Tensor x = random({kS * kB, 4 * kH}), y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  for (auto _ : state) {
    ops::gelu_forward(y, x, false);
    ops::gelu_backward(dx, y, x, false);
  }
  state.SetBytesProcessed(state.iterations() * 5 * x.nbytes());
}
BENCHMARK(BM_GeluForwardBackward)->Unit(benchmark::kMillisecond);

// The MLP's activation in a bf16 run, fc1's bias included: Arg 0 the ops in sequence (bias_add,
// gelu_forward, rounding for fc2's GEMM), Arg 1 the fused bias + GELU writing bf16 directly. Same
// bits (tests/tensor/test_ops.cpp).
void BM_BiasGeluBf16(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const Shape s{kS * kB, 4 * kH};
  const Tensor y0 = random(s), bias = random({s[1]});
  Tensor y = y0.clone(), act = Tensor::empty(s), act16 = Tensor::empty(s, DType::kBF16);
  for (auto _ : state) {
    state.PauseTiming();
    y.copy_from(y0);  // the bias is added in place
    state.ResumeTiming();
    if (fused) {
      ops::bias_gelu_forward(act16, y, bias, false);
    } else {
      ops::bias_add(y, bias);
      ops::gelu_forward(act, y, false);
      act16.copy_from(act);
    }
  }
}
BENCHMARK(BM_BiasGeluBf16)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_AdamW(benchmark::State& state) {
  const int64_t n = 16 << 20;  // ~16 M parameters, config a's size
  Tensor p = random({n}), g = random({n}), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  ops::AdamWSpec spec{1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1};
  // Arg 1: a bf16 run's step, the compute copy rounded in the same pass (Arg 0: without one).
  Tensor rounded = Tensor::empty({n}, DType::kBF16);
  Tensor* out = state.range(0) != 0 ? &rounded : nullptr;
  for (auto _ : state) ops::adamw_step(p, m, v, g, spec, out);
  state.SetBytesProcessed(state.iterations() * (7 * p.nbytes() + (out ? rounded.nbytes() : 0)));
}
BENCHMARK(BM_AdamW)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The precision-aware optimizer's step over 16 M weights of a bf16 run (the compute copy written
// in the same pass), its moments stored as Arg: 0 fp32, 1 bf16 (read and written by the kernel),
// 2 fp16, 3 fp8 (scaled: ops::adamw_step_scaled's two passes, as the distributed optimizer runs
// them per segment).
void BM_AdamWMomentStorage(benchmark::State& state) {
  const int64_t n = 16 << 20;
  const auto kind = static_cast<MomentDType>(state.range(0));
  Tensor p = random({n}), g = random({n});
  Tensor rounded = Tensor::empty({n}, DType::kBF16);
  MomentStorage m(n, kind, DType::kF32, Device::kCPU, {{0, n}});
  MomentStorage v(n, kind, DType::kF32, Device::kCPU, {{0, n}});
  ops::AdamWSpec spec{1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1};
  Tensor mm, vv;
  for (auto _ : state) {
    if (m.scaled()) {
      ops::adamw_step_scaled(p, m.for_step(0, mm), v.for_step(0, vv), g, spec, &rounded);
    } else {
      mm = m.group(0);
      vv = v.group(0);
      ops::adamw_step(p, mm, vv, g, spec, &rounded);
    }
  }
  state.SetLabel(moment_dtype_name(kind));
}
BENCHMARK(BM_AdamWMomentStorage)
    ->Arg(static_cast<int>(MomentDType::kF32))
    ->Arg(static_cast<int>(MomentDType::kBF16))
    ->Arg(static_cast<int>(MomentDType::kF16))
    ->Arg(static_cast<int>(MomentDType::kFP8))
    ->Unit(benchmark::kMillisecond);

// One decoding step's GEMMs of GPT-2 124M (12 layers of QKV, projection, MLP in and out, then the
// 50304-row output layer; 124 M distinct weights, far beyond the caches, as in generation) for m
// rows (the batch), by ops::matmul (the skinny kernel for few rows) or oneDNN's matmul directly
// (cpu::gemm, what ops::matmul ran before it). Args: kernel (0 oneDNN, 1 ops::matmul), bf16, m.
// bytes/s are the weights' bytes streamed per second.
void BM_DecodeStepGemms(benchmark::State& state) {
  const bool ops_path = state.range(0), half = state.range(1);
  const int64_t m = state.range(2), h = 768, layers = 12, vocab = 50304;
  const DType dt = half ? DType::kBF16 : DType::kF32;
  std::vector<Tensor> weights;
  for (int64_t l = 0; l < layers; ++l) {
    for (auto [n, k] : {std::pair{3 * h, h}, {h, h}, {4 * h, h}, {h, 4 * h}})
      weights.push_back(random({n, k}, dt));
  }
  weights.push_back(random({vocab, h}, dt));
  const Tensor x = random({m, 4 * h}, dt);
  Tensor y = Tensor::empty({m, vocab});
  int64_t bytes = 0;
  for (const Tensor& w : weights) bytes += w.nbytes();
  for (auto _ : state) {
    for (const Tensor& w : weights) {
      const int64_t n = w.dim(0), k = w.dim(1);
      const Tensor xin = x.view({m * 4 * h}).slice0(0, m * k).view({m, k});
      Tensor out = y.view({m * vocab}).slice0(0, m * n).view({m, n});
      if (ops_path) {
        ops::matmul(out, xin, false, w, true);
      } else {
        cpu::gemm(cpu::GemmShape{m, n, k, false, true, k, k, n, dt, false}, xin.raw(), w.raw(),
                  out.data<float>());
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_DecodeStepGemms)
    ->ArgsProduct({{0, 1}, {0, 1}, {1, 4, 6, 8, 16}})
    ->ArgNames({"ops", "bf16", "m"})
    ->Unit(benchmark::kMillisecond);

// The memory bandwidth the kernels above can at best reach, over 512 MB (far beyond the caches):
// a read-only pass (sum of squares) and an in-place read + write pass (scaling). A memory-bound
// kernel's floor is its bytes moved divided by these rates.
void BM_MemoryRead(benchmark::State& state) {
  Tensor x = random({128 << 20});
  double sink = 0;
  for (auto _ : state) sink += ops::sum_squares(x);
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(state.iterations() * x.nbytes());
}
BENCHMARK(BM_MemoryRead)->Unit(benchmark::kMillisecond);

void BM_MemoryReadWrite(benchmark::State& state) {
  Tensor x = random({128 << 20});
  for (auto _ : state) ops::scale_inplace(x, 1.0);
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
BENCHMARK(BM_MemoryReadWrite)->Unit(benchmark::kMillisecond);

// FP8 quantisation of one operand, as a Linear's GEMM input: per-tensor (abs_max, then
// fp8_quantize: tensorwise's two passes) against the block-scaled recipes' shapes (mxfp8 1 x 32
// and 32 x 1, blockwise 1 x 128, 128 x 1 and 128 x 128). range(0): the recipe shape; range(1): 0
// config a's activation [2048, 256], 1 the tests' [32, 64].
void BM_Fp8Quantize(benchmark::State& state) {
  const bool small = state.range(1) == 1;
  const Tensor x = random(small ? Shape{32, 64} : Shape{kS * kB, kH});
  Tensor q = Tensor::empty(x.shape(), DType::kBF16);
  static const std::pair<int64_t, int64_t> kBlocks[] = {
      {1, 32}, {32, 1}, {1, 128}, {128, 1}, {128, 128}};
  const int64_t shape = state.range(0);
  for (auto _ : state) {
    if (shape == 0) {
      const double amax = ops::abs_max(x);
      ops::fp8_quantize(q, x, static_cast<float>(448.0 / amax), Fp8Format::kE4M3);
    } else {
      const auto [br, bc] = kBlocks[shape - 1];
      ops::fp8_block_quantize(q, x, br, bc,
                              shape <= 2 ? Fp8BlockRule::kMxfp8 : Fp8BlockRule::kBlockwise,
                              Fp8Format::kE4M3);
    }
  }
  state.SetItemsProcessed(state.iterations() * x.numel());
}
BENCHMARK(BM_Fp8Quantize)->ArgsProduct({{0, 1, 2, 3, 4, 5}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace megatron

BENCHMARK_MAIN();
