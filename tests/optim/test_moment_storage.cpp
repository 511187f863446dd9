// MomentStorage (the precision-aware optimizer's Adam moments) against a scalar restatement of
// Transformer Engine FusedAdam's storage rules: bf16 rounding; fp16 and fp8 scaled per group by
// the group's absmax over 32752 (half fp16's largest value) or 448 (E4M3's largest).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "optim/moment_storage.h"
#include "tensor/tensor.h"

namespace megatron {
namespace {

// Values over many binades with both signs (Adam's first moment) and a zero, group by group.
Tensor values(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n});
  uint64_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;  // [0, 1)
    const double mag = std::ldexp(1.0 + u, -static_cast<int>((x >> 3) % 24));
    t.data<float>()[i] = static_cast<float>((x & 1) ? -mag : mag);
  }
  t.data<float>()[n / 2] = 0.0f;
  return t;
}

// What FusedAdam keeps of value v in a group with absmax a, read back in fp32.
float restated(MomentDType t, float v, float a) {
  switch (t) {
    case MomentDType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
    case MomentDType::kF16: {
      const float scale = a / 32752.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      return f16_to_f32(f32_to_f16(v * inv)) * scale;
    }
    case MomentDType::kFP8: {
      const float q = a > 0 ? 1.0f / (a / 448.0f) : 0.0f;  // the quantiser's scale, 1 / scale
      const float dq = q > 0 ? 1.0f / q : 0.0f;            // the FP8 tensor's scale_inv
      return fp8_round(v * q, Fp8Format::kE4M3) * dq;
    }
    default:
      return v;
  }
}

const std::vector<std::pair<int64_t, int64_t>> kGroups = {
    {0, 100}, {112, 112}, {112, 1131}, {1140, 1141}};
constexpr int64_t kNumel = 1150;  // 8 + 1 padding elements between and after the groups

TEST(MomentStorage, StoresAsFusedAdamDoes) {
  for (MomentDType t :
       {MomentDType::kF32, MomentDType::kBF16, MomentDType::kF16, MomentDType::kFP8}) {
    MomentStorage s(kNumel, t, DType::kF32, Device::kCPU, kGroups);
    EXPECT_EQ(s.nbytes(), kNumel * moment_element_bytes(t));
    const Tensor all = values(kNumel, 7);
    for (int64_t k = 0; k < s.num_groups(); ++k) {
      const auto [b, e] = kGroups[static_cast<size_t>(k)];
      Tensor v = all.flat_view(b, {e - b}).clone();
      s.store(k, v);
    }
    const Tensor back = s.to_f32();
    for (int64_t k = 0; k < s.num_groups(); ++k) {
      const auto [b, e] = kGroups[static_cast<size_t>(k)];
      float a = 0;
      for (int64_t i = b; i < e; ++i) a = std::max(a, std::fabs(all.data<float>()[i]));
      const Tensor group = s.unscaled(k);
      for (int64_t i = b; i < e; ++i) {
        const float want = restated(t, all.data<float>()[i], a);
        ASSERT_EQ(back.data<float>()[i], want) << moment_dtype_name(t) << " element " << i;
        ASSERT_EQ(group.data<float>()[i - b], want) << moment_dtype_name(t) << " element " << i;
      }
      // The group's largest value survives at the top of the range (fp16: within its rounding).
      if (e - b > 1 && t == MomentDType::kF16) {
        EXPECT_NEAR(s.read_scale(k), a / 32752.0f, a / 32752.0f * 1e-6);
      }
    }
    // Padding: never written.
    for (int64_t i : {int64_t{100}, int64_t{111}, int64_t{1131}, int64_t{1139}, int64_t{1149}})
      EXPECT_EQ(back.data<float>()[i], 0.0f) << moment_dtype_name(t) << " padding " << i;
  }
}

TEST(MomentStorage, ErrorsStayInsideTheFormatsRounding) {
  // Bounds from the formats' rounding of the scaled values (the absmax a lands near the top of
  // the range): fp16 rounds each within 2^-11 of itself (10 mantissa bits; its subnormal steps,
  // 2^-24 of the range's scale, are far smaller), so within a x 2^-11 unscaled; E4M3 within 2^-4
  // (3 mantissa bits; subnormal steps 2^-9 x a / 448), so within a x 2^-4; bf16, unscaled,
  // within 2^-8 of each value (7 mantissa bits, rounded to nearest: half a step of 2^-7).
  const Tensor all = values(1000, 11);
  float a = 0;
  for (int64_t i = 0; i < 1000; ++i) a = std::max(a, std::fabs(all.data<float>()[i]));
  for (const auto& [t, rel] : {std::pair{MomentDType::kF16, 1.0 / 2048},
                               {MomentDType::kFP8, 1.0 / 16},
                               {MomentDType::kBF16, 1.0 / 256}}) {
    MomentStorage s(1000, t, DType::kF32, Device::kCPU, {{0, 1000}});
    Tensor v = all.clone();
    s.store(0, v);
    const Tensor back = s.unscaled(0);
    for (int64_t i = 0; i < 1000; ++i) {
      const double x = all.data<float>()[i], y = back.data<float>()[i];
      const double bound = t == MomentDType::kBF16 ? std::fabs(x) * rel : a * rel;
      ASSERT_LE(std::fabs(x - y), bound) << moment_dtype_name(t) << " element " << i;
    }
  }
}

TEST(MomentStorage, AllZeroGroupAndRoundTrips) {
  for (MomentDType t :
       {MomentDType::kF32, MomentDType::kBF16, MomentDType::kF16, MomentDType::kFP8}) {
    MomentStorage s(16, t, DType::kF32, Device::kCPU, {{0, 8}, {8, 16}});
    // A group that never moved (a gradient of zeros): scale 0, zeros read back, no NaN.
    Tensor z = Tensor::zeros({8});
    s.store(0, z);
    EXPECT_EQ(s.unscaled(0).item(3), 0.0) << moment_dtype_name(t);
    // from_f32(to_f32()) keeps fp32 and bf16 storage exactly (what a resumed run relies on).
    Tensor v = values(8, 5);
    s.store(1, v);
    const Tensor once = s.to_f32();
    s.from_f32(once);
    const Tensor twice = s.to_f32();
    if (t == MomentDType::kF32 || t == MomentDType::kBF16) {
      for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(once.item(i), twice.item(i)) << i;
    }
  }
  EXPECT_THROW(MomentStorage(8, MomentDType::kBF16, DType::kF64, Device::kCPU, {{0, 8}}),
               InvalidArgument);
  EXPECT_THROW(MomentStorage(8, MomentDType::kF16, DType::kF32, Device::kCPU, {{4, 9}}),
               InvalidArgument);
  MomentDType t{};
  EXPECT_TRUE(parse_moment_dtype("fp8", &t));
  EXPECT_EQ(t, MomentDType::kFP8);
  EXPECT_FALSE(parse_moment_dtype("e4m3", &t));
}

}  // namespace
}  // namespace megatron
