// The CUDA device's kernels at training sizes, timed with the device synchronised around each
// batch of calls: GEMMs through cuBLASLt (f32 without TF32, bf16) against their FLOP count, the
// attention forward and backward of a GPT-2-sized layer, and the memory-bound ops against the
// bytes they move. Prints one line per measurement; run where a GPU is visible.
//   build/bench/bench_cuda [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "tensor/ops.h"

namespace megatron {
namespace {

constexpr Device kGpu = Device::kCUDA;

// Seconds per call of fn, the median of `reps` batches of `calls` calls after a warm-up batch.
double time_per_call(const std::function<void()>& fn, int calls, int reps = 5) {
  for (int i = 0; i < calls; ++i) fn();
  device_synchronize(kGpu);
  double best[16];
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) fn();
    device_synchronize(kGpu);
    best[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
  }
  std::sort(best, best + reps);
  return best[reps / 2];
}

Tensor random_on_gpu(const Shape& s, DType t, double scale = 1.0) {
  Tensor h = Tensor::empty(s, DType::kF32);
  float* p = h.data<float>();
  uint32_t x = 12345;
  for (int64_t i = 0; i < h.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<float>((static_cast<double>(x >> 8) / 16777216.0 - 0.5) * 2 * scale);
  }
  return h.to(t).to(kGpu);
}

void gemm(int64_t m, int64_t n, int64_t k, DType t, bool trans_b) {
  const Tensor a = random_on_gpu({m, k}, t),
               b = random_on_gpu(trans_b ? Shape{n, k} : Shape{k, n}, t);
  Tensor c = Tensor::empty({m, n}, DType::kF32, kGpu);
  const double s = time_per_call([&] { ops::matmul(c, a, false, b, trans_b); }, 10);
  std::printf("gemm %-4s %5ld x %5ld x %5ld%s  %8.3f ms  %7.1f TFLOP/s\n", dtype_name(t),
              static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
              trans_b ? " (B^T)" : "      ", s * 1e3, 2.0 * m * n * k / s / 1e12);
}

// precision kF32: the CUDA-core kernel; kBF16: the tensor cores (a bf16 run's attention).
void attention(int64_t s, int64_t b, int64_t heads, int64_t hn, DType precision) {
  const Tensor qkv = random_on_gpu({s, b, heads, 3, hn}, DType::kF32);
  const auto q = ops::packed_qkv_view(qkv, ops::QkvPart::kQuery);
  const auto k = ops::packed_qkv_view(qkv, ops::QkvPart::kKey);
  const auto v = ops::packed_qkv_view(qkv, ops::QkvPart::kValue);
  Tensor out = Tensor::empty({s, b, heads, hn}, DType::kF32, kGpu);
  Tensor lse = Tensor::empty({b, heads, s}, DType::kF32, kGpu);
  ops::AttentionSpec spec;
  spec.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hn)));
  spec.precision = precision;
  const double fwd = time_per_call([&] { ops::attention_forward(out, lse, q, k, v, spec); }, 3);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::kF32, kGpu);
  const Tensor dout = random_on_gpu(out.shape(), DType::kF32);
  const auto dq = ops::packed_qkv_view(dqkv, ops::QkvPart::kQuery);
  const auto dk = ops::packed_qkv_view(dqkv, ops::QkvPart::kKey);
  const auto dv = ops::packed_qkv_view(dqkv, ops::QkvPart::kValue);
  const double bwd = time_per_call(
      [&] { ops::attention_backward(dq, dk, dv, Tensor(), dout, q, k, v, out, lse, spec); }, 3);
  // Causal: half of the s x s scores; forward 2 GEMM-like products, backward 5 (incl. recompute).
  const double flops_fwd = 2.0 * 2 * b * heads * s * s * hn / 2;
  std::printf(
      "attention %s s%ld b%ld heads%ld hn%ld causal  fwd %8.3f ms (%6.1f TFLOP/s)  bwd "
      "%8.3f ms (%6.1f TFLOP/s)\n",
      precision == DType::kF32 ? "f32 " : "bf16", static_cast<long>(s), static_cast<long>(b),
      static_cast<long>(heads), static_cast<long>(hn), fwd * 1e3, flops_fwd / fwd / 1e12, bwd * 1e3,
      2.5 * flops_fwd / bwd / 1e12);
}

void memory_bound(int64_t rows, int64_t h, int64_t vocab) {
  const Tensor x = random_on_gpu({rows, h}, DType::kF32), w = random_on_gpu({h}, DType::kF32);
  const Tensor bias = random_on_gpu({h}, DType::kF32);
  Tensor y = Tensor::empty({rows, h}, DType::kF32, kGpu);
  Tensor mean = Tensor::empty({rows}, DType::kF32, kGpu),
         rstd = Tensor::empty({rows}, DType::kF32, kGpu);
  const double ln =
      time_per_call([&] { ops::layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f); }, 20);
  const double gelu = time_per_call([&] { ops::gelu_forward(y, x, false); }, 20);
  const double bytes = 2.0 * rows * h * 4;
  std::printf("layernorm f32 [%ld, %ld]  %8.3f ms  %7.1f GB/s\n", static_cast<long>(rows),
              static_cast<long>(h), ln * 1e3, bytes / ln / 1e9);
  std::printf("gelu      f32 [%ld, %ld]  %8.3f ms  %7.1f GB/s\n", static_cast<long>(rows),
              static_cast<long>(h), gelu * 1e3, bytes / gelu / 1e9);
  const Tensor logits = random_on_gpu({rows, vocab}, DType::kF32, 4.0);
  Tensor targets_h = Tensor::empty({rows}, DType::kI64);
  for (int64_t i = 0; i < rows; ++i) targets_h.data<int64_t>()[i] = (i * 7919) % vocab;
  const Tensor targets = targets_h.to(kGpu);
  Tensor loss = Tensor::empty({rows}, DType::kF32, kGpu),
         lse = Tensor::empty({rows}, DType::kF32, kGpu);
  const double ce =
      time_per_call([&] { ops::cross_entropy_forward(loss, lse, logits, targets, vocab); }, 5);
  std::printf("cross entropy f32 [%ld, %ld]  %8.3f ms  %7.1f GB/s\n", static_cast<long>(rows),
              static_cast<long>(vocab), ce * 1e3, 2.0 * rows * vocab * 4 / ce / 1e9);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  using namespace megatron;
  std::string why;
  if (!device_available(kGpu, &why)) {
    std::printf("bench_cuda: no GPU (%s)\n", why.c_str());
    return 2;
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf("device: %s\n", device_description(kGpu).c_str());
  for (int64_t n : {4096, 8192}) {
    gemm(n, n, n, DType::kBF16, false);
    gemm(n, n, n, DType::kF32, false);
    if (quick) break;
  }
  // GPT-2 124M's layer GEMMs at 8 x 1024 tokens: QKV, out-proj, MLP up, output layer (B^T).
  gemm(8192, 2304, 768, DType::kBF16, true);
  gemm(8192, 3072, 768, DType::kBF16, true);
  gemm(8192, 50304, 768, DType::kBF16, true);
  attention(1024, 8, 12, 64, DType::kF32);
  // The tensor cores: GPT-2 124M's and 350M's layers (hn 64), a Llama layer (hn 128).
  attention(1024, 8, 12, 64, DType::kBF16);
  attention(1024, 8, 16, 64, DType::kBF16);
  attention(4096, 2, 32, 128, DType::kBF16);
  memory_bound(8192, 768, 50304);
  return 0;
}
