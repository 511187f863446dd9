// The CUDA device beyond the op harness: tensors moving between host and GPU memory, conversions
// on the GPU bit for bit as on the host, 16-bit GEMM inputs, the caching allocator, and the
// message a build or machine without a GPU gives. The tests that need a GPU are skipped, saying
// why, where none is visible; the message test runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron {
namespace {

#define MEGATRON_NEED_GPU()                                                        \
  do {                                                                             \
    std::string why;                                                               \
    if (!device_available(Device::kCUDA, &why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

// Without a usable GPU, CUDA tensors are refused with the reason, not a crash.
TEST(CudaDevice, WithoutAGpuAllocationIsRefusedWithTheReason) {
  std::string why;
  if (device_available(Device::kCUDA, &why)) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(why.empty());
  try {
    Tensor::empty({4}, DType::kF32, Device::kCUDA);
    FAIL() << "allocated a CUDA tensor without a GPU";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, TensorsRoundTripExactlyForEveryDtype) {
  MEGATRON_NEED_GPU();
  const Tensor x = testing::random_tensor({37, 5}, 1, 3.0, DType::kF64);
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    const Tensor host = x.to(t);
    const Tensor back = host.to(Device::kCUDA).to(Device::kCPU);
    ASSERT_EQ(back.device(), Device::kCPU);
    EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0) << dtype_name(t);
    // item() reads through to device memory.
    EXPECT_EQ(host.to(Device::kCUDA).item(7), host.item(7)) << dtype_name(t);
  }
  Tensor z = Tensor::zeros({1000}, DType::kF32, Device::kCUDA);
  EXPECT_EQ(ops::sum_squares(z), 0.0);
  z.fill(1.5);
  EXPECT_EQ(ops::sum_squares(z), 1000 * 2.25);
}

// Conversions on the GPU round exactly as core/dtype.h does on the host: ties to even, NaN stays
// NaN, overflow to infinity, subnormals.
TEST(CudaDevice, ConversionsOnTheGpuMatchTheHostBitForBit) {
  MEGATRON_NEED_GPU();
  Tensor f = testing::random_tensor({4096}, 2, 10.0, DType::kF32);
  float* p = f.data<float>();
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 1.0f / 256,  // a bf16 tie
                            1.0f + 3.0f / 256,  // a tie rounding up
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            65520.0f,                  // rounds to f16 infinity
                            65504.0f,                  // f16's largest
                            6.1e-5f,                   // just below f16's smallest normal
                            3.0e-7f,                   // an f16 subnormal
                            2.98023223876953125e-8f,   // half f16's smallest subnormal: ties to 0
                            -8.94069671630859375e-8f,  // 1.5 subnormals: ties to 2
                            1e-8f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); ++i) p[i] = specials[i];
  const Tensor on_gpu = f.to(Device::kCUDA);
  for (DType t : {DType::kBF16, DType::kF16, DType::kF64}) {
    const Tensor want = f.to(t);
    const Tensor got = on_gpu.to(t).to(Device::kCPU);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << "f32 -> " << dtype_name(t);
    const Tensor back_want = want.to(DType::kF32);
    const Tensor back_got = want.to(Device::kCUDA).to(DType::kF32).to(Device::kCPU);
    EXPECT_EQ(std::memcmp(back_got.raw(), back_want.raw(), back_want.nbytes()), 0)
        << dtype_name(t) << " -> f32";
  }
}

// bf16 and f16 inputs accumulate in f32: the result equals the f32 GEMM of the rounded inputs up
// to f32 summation order (NMSE 1e-10: a wrong term or a bf16 accumulation gives 1e-6 or more).
TEST(CudaDevice, HalfGemmsAccumulateInF32) {
  MEGATRON_NEED_GPU();
  const int64_t m = 67, n = 130, k = 300;
  const Tensor a = testing::random_tensor({m, k}, 3, 1.0, DType::kF32);
  const Tensor b = testing::random_tensor({n, k}, 4, 1.0, DType::kF32);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Tensor ah = a.to(t), bh = b.to(t);
    Tensor want = Tensor::empty({m, n});
    ops::matmul(want, ah.to(DType::kF32), false, bh.to(DType::kF32), true);
    Tensor got = Tensor::empty({m, n}, DType::kF32, Device::kCUDA);
    ops::matmul(got, ah.to(Device::kCUDA), false, bh.to(Device::kCUDA), true);
    const Tensor g = got.to(Device::kCPU);
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double d = g.item(i) - want.item(i);
      num += d * d;
      den += want.item(i) * want.item(i);
    }
    EXPECT_LT(num / den, 1e-10) << dtype_name(t);
  }
}

// --tf32: off by default (f32 GEMMs round like the CPU's: NMSE against f64 about 1e-13 here, so
// below 1e-10); on, the products use TF32's 10-bit mantissas (relative error about 1e-3, NMSE
// about 1e-7: between 1e-9 and 1e-5).
TEST(CudaDevice, Tf32IsOffByDefaultAndLowersF32GemmPrecisionWhenOn) {
  MEGATRON_NEED_GPU();
  EXPECT_FALSE(cuda_tf32());
  const Tensor a = testing::random_tensor({128, 512}, 5, 1.0, DType::kF64);
  const Tensor b = testing::random_tensor({96, 512}, 6, 1.0, DType::kF64);
  Tensor want = Tensor::empty({128, 96}, DType::kF64);
  ops::matmul(want, a, false, b, true);
  auto nmse_on_gpu = [&] {
    Tensor got = Tensor::empty({128, 96}, DType::kF32, Device::kCUDA);
    ops::matmul(got, a.to(DType::kF32).to(Device::kCUDA), false,
                b.to(DType::kF32).to(Device::kCUDA), true);
    const Tensor g = got.to(Device::kCPU);
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      num += (g.item(i) - want.item(i)) * (g.item(i) - want.item(i));
      den += want.item(i) * want.item(i);
    }
    return num / den;
  };
  EXPECT_LT(nmse_on_gpu(), 1e-10);
  set_cuda_tf32(true);
  const double tf32 = nmse_on_gpu();
  set_cuda_tf32(false);
  EXPECT_GT(tf32, 1e-9);
  EXPECT_LT(tf32, 1e-5);
}

// Normalised mean squared error of got against want (host tensors of any dtype).
double nmse(const Tensor& got, const Tensor& want) {
  return testing::nmse(to_host(got), to_host(want));
}

Tensor rounded_to_bf16(const Tensor& x) {
  return x.to(DType::kBF16).to(DType::kF32);
}

// Attention in a bf16 run (AttentionSpec::precision) takes the tensor cores for head dimensions
// 64 and 128: q, k, v, dout, the probabilities and dS rounded to bf16, f32 accumulation. Against
// the CPU's f32 attention of the same bf16-rounded q, k, v and dout, what is left is the rounding
// of the probabilities (forward) and of P and dS (backward): a relative 2^-9 per element, NMSE
// about 1e-6 here; 1e-4 leaves room, while a wrong mask, scale, GQA head or dropout mask gives
// 1e-2 or more. The result must also differ from the CUDA-core kernel's on the unrounded inputs
// (their bf16 rounding alone moves it by NMSE ~1e-6; above 1e-9 shows the tensor cores ran).
TEST(CudaDevice, TensorCoreAttentionMatchesF32AttentionOfRoundedInputs) {
  MEGATRON_NEED_GPU();
  struct Case {
    int64_t sq, skv, b, np, ng, hn;
    bool causal;
    int64_t q_offset;
    bool docs, padding;
    float dropout;
  };
  // GQA with ragged tiles; hn 128 with documents and dropout; bidirectional with padded keys;
  // queries after a cache of keys (a decode step's q_offset).
  const Case cases[] = {{100, 100, 2, 4, 2, 64, true, 0, false, false, 0.0f},
                        {130, 130, 1, 2, 2, 128, true, 0, true, false, 0.1f},
                        {70, 150, 2, 2, 1, 64, false, 0, false, true, 0.0f},
                        {37, 101, 1, 4, 4, 128, true, 64, false, false, 0.0f}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const std::string what = "sq " + std::to_string(c.sq) + " hn " + std::to_string(c.hn);
    const Tensor q = testing::random_tensor({c.sq, c.b, c.np, c.hn}, ++seed, 1.0);
    const Tensor k = testing::random_tensor({c.skv, c.b, c.ng, c.hn}, ++seed, 1.0);
    const Tensor v = testing::random_tensor({c.skv, c.b, c.ng, c.hn}, ++seed, 1.0);
    const Tensor dout = testing::random_tensor({c.sq, c.b, c.np, c.hn}, ++seed, 1.0);
    ops::AttentionSpec spec;
    spec.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.hn)));
    spec.causal = c.causal;
    spec.q_offset = c.q_offset;
    spec.dropout = c.dropout;
    spec.seed = 7;
    spec.stream = 3;
    if (c.docs) {  // a second document starts at position 50
      spec.doc_start = Tensor::empty({c.b, c.sq}, DType::kI32);
      for (int64_t i = 0; i < c.b * c.sq; ++i)
        spec.doc_start.data<int32_t>()[i] = i % c.sq < 50 ? 0 : 50;
    }
    if (c.padding) {  // the last 20 keys of sequence 1 are padding
      spec.key_valid = Tensor::empty({c.b, c.skv}, DType::kI32);
      for (int64_t i = 0; i < c.b * c.skv; ++i)
        spec.key_valid.data<int32_t>()[i] = i / c.skv == 1 && i % c.skv >= c.skv - 20 ? 0 : 1;
    }
    struct Result {
      Tensor out, lse, dq, dk, dv;
    };
    auto run = [&](Device device, const ops::AttentionSpec& sp, const Tensor& qi, const Tensor& ki,
                   const Tensor& vi, const Tensor& di) {
      Result r;
      r.out = Tensor::empty(qi.shape(), DType::kF32, device);
      r.lse = Tensor::empty({c.b, c.np, c.sq}, DType::kF32, device);
      r.dq = Tensor::empty(qi.shape(), DType::kF32, device);
      r.dk = Tensor::empty(ki.shape(), DType::kF32, device);
      r.dv = Tensor::empty(vi.shape(), DType::kF32, device);
      const Tensor qd = qi.to(device), kd = ki.to(device), vd = vi.to(device), dd = di.to(device);
      ops::attention_forward(r.out, r.lse, ops::attention_view(qd, c.ng),
                             ops::attention_view(kd, c.ng), ops::attention_view(vd, c.ng), sp);
      ops::attention_backward(ops::attention_view(r.dq, c.ng), ops::attention_view(r.dk, c.ng),
                              ops::attention_view(r.dv, c.ng), Tensor(), dd,
                              ops::attention_view(qd, c.ng), ops::attention_view(kd, c.ng),
                              ops::attention_view(vd, c.ng), r.out, r.lse, sp);
      return r;
    };
    ops::AttentionSpec gpu_spec = spec;
    gpu_spec.precision = DType::kBF16;
    if (spec.doc_start.defined()) gpu_spec.doc_start = spec.doc_start.to(Device::kCUDA);
    if (spec.key_valid.defined()) gpu_spec.key_valid = spec.key_valid.to(Device::kCUDA);
    const Result want = run(Device::kCPU, spec, rounded_to_bf16(q), rounded_to_bf16(k),
                            rounded_to_bf16(v), rounded_to_bf16(dout));
    const Result got = run(Device::kCUDA, gpu_spec, q, k, v, dout);
    EXPECT_LT(nmse(got.out, want.out), 1e-4) << what;
    EXPECT_LT(nmse(got.lse, want.lse), 1e-8) << what;  // f32 sums of f32 probabilities
    EXPECT_LT(nmse(got.dq, want.dq), 1e-4) << what;
    EXPECT_LT(nmse(got.dk, want.dk), 1e-4) << what;
    EXPECT_LT(nmse(got.dv, want.dv), 1e-4) << what;
    ops::AttentionSpec f32_spec = gpu_spec;
    f32_spec.precision = DType::kF32;
    const Result cores = run(Device::kCUDA, f32_spec, q, k, v, dout);
    EXPECT_GT(nmse(got.out, cores.out), 1e-9) << what << ": the tensor-core kernel did not run";
    EXPECT_LT(nmse(cores.out, run(Device::kCPU, spec, q, k, v, dout).out), 1e-10) << what;
  }
}

TEST(CudaDevice, EmbeddingOfAHalfTableGathersItsRows) {
  MEGATRON_NEED_GPU();
  const Tensor table = testing::random_tensor({50, 24}, 9, 1.0).to(DType::kBF16);
  const Tensor ids = testing::random_ids({7, 3}, 10, 50);
  Tensor want = Tensor::empty({21, 24}, DType::kBF16);
  ops::embedding_forward(want, ids, table);
  Tensor got = Tensor::empty({21, 24}, DType::kBF16, Device::kCUDA);
  ops::embedding_forward(got, ids.to(Device::kCUDA), table.to(Device::kCUDA));
  const Tensor g = to_host(got);
  EXPECT_EQ(std::memcmp(g.raw(), want.raw(), want.nbytes()), 0);
}

TEST(CudaDevice, OpsRefuseTensorsOnTwoDevices) {
  MEGATRON_NEED_GPU();
  Tensor out = Tensor::empty({4}, DType::kF32, Device::kCUDA);
  const Tensor a = Tensor::zeros({4}), b = Tensor::zeros({4}, DType::kF32, Device::kCUDA);
  EXPECT_THROW(ops::add(out, a, b), InvalidArgument);
}

}  // namespace
}  // namespace megatron
