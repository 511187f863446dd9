// The FP8 codecs (core/fp8.h) against an independent restatement of the OCP 8-bit floating point
// specification: every code decoded from its bit fields, and every float of a dense sweep encoded
// by searching all finite codes for the nearest (ties to the even code, i.e. mantissa LSB 0),
// saturating beyond the largest finite value. Exact equality throughout: both sides are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp8.h"

namespace megatron {
namespace {

struct Spec {
  Fp8Format format;
  int exponent_bits, mantissa_bits, bias;
};
constexpr Spec kSpecs[] = {{Fp8Format::kE4M3, 4, 3, 7}, {Fp8Format::kE5M2, 5, 2, 15}};

// The OCP definition of a code's value, in double.
double ocp_value(uint8_t code, const Spec& s) {
  const int e = (code >> s.mantissa_bits) & ((1 << s.exponent_bits) - 1);
  const int m = code & ((1 << s.mantissa_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int all_ones = (1 << s.exponent_bits) - 1;
  if (s.format == Fp8Format::kE4M3 && e == all_ones && m == (1 << s.mantissa_bits) - 1)
    return std::nan("");                              // E4M3: only S.1111.111 is special
  if (s.format == Fp8Format::kE5M2 && e == all_ones)  // E5M2: IEEE-like specials
    return m == 0 ? sign * INFINITY : std::nan("");
  const double frac = static_cast<double>(m) / (1 << s.mantissa_bits);
  if (e == 0) return sign * frac * std::pow(2.0, 1 - s.bias);
  return sign * (1.0 + frac) * std::pow(2.0, e - s.bias);
}

struct Finite {
  double value;
  uint8_t code;
};
// Every finite non-negative code, by value.
std::vector<Finite> finite_codes(const Spec& s) {
  std::vector<Finite> out;
  for (int c = 0; c < 0x80; ++c) {
    const double v = ocp_value(static_cast<uint8_t>(c), s);
    if (std::isfinite(v)) out.push_back({v, static_cast<uint8_t>(c)});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.value < b.value; });
  return out;
}

// The reference encoder: nearest finite code, ties to the even code, saturating.
uint8_t ocp_encode(float x, const std::vector<Finite>& codes) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= codes.back().value) return sign | codes.back().code;
  auto hi = std::lower_bound(codes.begin(), codes.end(), a,
                             [](const Finite& f, double v) { return f.value < v; });
  if (hi->value == a) return sign | hi->code;
  auto lo = hi - 1;
  const double dl = a - lo->value, dh = hi->value - a;
  if (dl < dh) return sign | lo->code;
  if (dh < dl) return sign | hi->code;
  return sign | ((lo->code & 1) == 0 ? lo->code : hi->code);
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Fp8, EveryCodeDecodesAsTheSpecificationSays) {
  for (const Spec& s : kSpecs) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = ocp_value(static_cast<uint8_t>(c), s);
      const float got = fp8_decode(static_cast<uint8_t>(c), s.format);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << fp8_format_name(s.format) << " code " << c;
        continue;
      }
      EXPECT_EQ(static_cast<double>(got), want) << fp8_format_name(s.format) << " code " << c;
      if (!std::isfinite(want)) continue;
      ++finite;
      // Every finite code round-trips (both zeros included).
      EXPECT_EQ(fp8_encode(got, s.format), c);
    }
    // The counts of the specification: 254 finite codes (+-0 included) for E4M3, 248 for E5M2.
    EXPECT_EQ(finite, s.format == Fp8Format::kE4M3 ? 254 : 248);
  }
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0f);
}

TEST(Fp8, CodeOfEveryValueAndTheDecodeTableInvertTheCodec) {
  for (const Spec& s : kSpecs) {
    const float* table = fp8_decode_table(s.format);
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      const float v = fp8_decode(code, s.format);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(table[c])) << c;
        EXPECT_EQ(fp8_code_of(v, s.format) & 0x7F, 0x7F) << c;  // NaN: the canonical NaN code
        continue;
      }
      EXPECT_EQ(std::bit_cast<uint32_t>(table[c]), std::bit_cast<uint32_t>(v)) << c;
      if (std::isinf(v)) continue;  // E5M2's infinities: saturated away before any encoding
      EXPECT_EQ(fp8_code_of(v, s.format), code) << fp8_format_name(s.format) << " code " << c;
    }
  }
}

TEST(Fp8, InlineCodecAgreesWithTheScalarEncoderOnEveryKindOfInput) {
  // fp8_round and fp8_code_of choose between their subnormal and normal results and NaN with
  // selects (so that the kernels' loops vectorise): against the out-of-line fp8_encode, which
  // derives the code with frexp, over every 61st f32 bit pattern (both signs, every exponent,
  // NaNs and infinities) and every pattern from 2^-17 to 2^17 whose low 12 mantissa bits are
  // 0x7FF, 0x800, 0x801, 0xFFF or 0 (both formats' rounding points and subnormals lie there).
  for (const Spec& s : kSpecs) {
    int64_t bad = 0;
    uint32_t first_bad = 0;
    auto check = [&](uint32_t bits) {
      const float x = std::bit_cast<float>(bits);
      if (fp8_code_of(fp8_round(x, s.format), s.format) != fp8_encode(x, s.format) && bad++ == 0)
        first_bad = bits;
    };
    for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 61) check(static_cast<uint32_t>(b));
    for (uint32_t b = 0x37000000u; b < 0x48000000u; b += 0x1000u) {
      for (uint32_t low : {0x7FFu, 0x800u, 0x801u, 0xFFFu, 0x0u}) {
        for (uint32_t sign : {0u, 0x80000000u}) check(sign | (b & ~0xFFFu) | low);
      }
    }
    EXPECT_EQ(bad, 0) << fp8_format_name(s.format) << ": first at bits 0x" << std::hex << first_bad;
    // Infinities saturate to the largest finite value; NaN stays NaN.
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(fp8_round(inf, s.format), fp8_max(s.format));
    EXPECT_EQ(fp8_round(-inf, s.format), -fp8_max(s.format));
    EXPECT_TRUE(std::isnan(fp8_round(std::numeric_limits<float>::quiet_NaN(), s.format)));
  }
}

TEST(Fp8, DenseSweepEncodesToTheNearestCodeTiesToEvenSaturating) {
  for (const Spec& s : kSpecs) {
    const std::vector<Finite> codes = finite_codes(s);
    std::vector<float> xs;
    // Every 2^-11 relative step of the f32 line (about 2^20 values), all exponents.
    for (uint32_t u = 0; u < 0x7F800000u; u += 1u << 11) xs.push_back(float_of(u + 0x155u));
    // Each midpoint between neighbouring codes (the ties) and the floats just either side of it.
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const float mid = static_cast<float>((codes[i].value + codes[i + 1].value) / 2);
      xs.push_back(mid);
      xs.push_back(std::nextafter(mid, 0.0f));
      xs.push_back(std::nextafter(mid, INFINITY));
    }
    // Around the largest finite value: its half-ulp above and far beyond, infinity.
    const float mx = fp8_max(s.format);
    for (float x : {mx, std::nextafter(mx, INFINITY), mx * 1.0625f, mx * 1.125f, mx * 4.0f, 3.0e38f,
                    INFINITY, 0.0f})
      xs.push_back(x);
    int64_t checked = 0;
    for (float x : xs) {
      for (float v : {x, -x}) {
        const uint8_t want = ocp_encode(v, codes);
        ASSERT_EQ(fp8_encode(v, s.format), want) << fp8_format_name(s.format) << " x=" << v;
        const float rounded = fp8_round(v, s.format);
        ASSERT_EQ(rounded, fp8_decode(want, s.format)) << fp8_format_name(s.format) << " x=" << v;
        ASSERT_EQ(std::signbit(rounded), std::signbit(v)) << "x=" << v;
        // The vectorisable code of the rounded value (FP8 primary weights' encoding kernels).
        ASSERT_EQ(fp8_code_of(rounded, s.format), want) << fp8_format_name(s.format) << " x=" << v;
        ++checked;
      }
    }
    EXPECT_GT(checked, 2'000'000);
    // NaN stays NaN (the sign kept); infinities saturate (__NV_SATFINITE).
    EXPECT_TRUE(std::isnan(fp8_round(std::nanf(""), s.format)));
    EXPECT_EQ(fp8_encode(std::nanf(""), s.format), 0x7F);
    EXPECT_EQ(fp8_round(-INFINITY, s.format), -mx);
  }
  // Spot values worked by hand: 17 lies between E4M3's 16 and 18 and ties to 16 (mantissa 000);
  // 0.0009765625 = 2^-10 is half of E4M3's smallest subnormal and ties to zero; E5M2's 1.125 is
  // the midpoint of 1 and 1.25 and ties to 1.
  EXPECT_EQ(fp8_round(17.0f, Fp8Format::kE4M3), 16.0f);
  EXPECT_EQ(fp8_round(19.0f, Fp8Format::kE4M3), 20.0f);
  EXPECT_EQ(fp8_round(0x1p-10f, Fp8Format::kE4M3), 0.0f);
  EXPECT_EQ(fp8_round(0x1.8p-10f, Fp8Format::kE4M3), 0x1p-9f);
  EXPECT_EQ(fp8_round(1.125f, Fp8Format::kE5M2), 1.0f);
  EXPECT_EQ(fp8_round(1.375f, Fp8Format::kE5M2), 1.5f);
}

// Block scales (fp8_block_scale) against what each rule promises, stated independently of TE's
// bit arithmetic: MXFP8's decoding factor is the smallest power of two that brings the block's
// amax within the format (2^ceil(log2(amax / max)), its scale the inverse); blockwise's scale is
// the largest power of two not above the f32 quotient max / amax. Swept over every bf16 amax from
// 2^-100 to 2^100 (the amaxes of bf16 tensors) and a million random f32 ones; exact equality.
double power_of_two_at_least(double v) {  // 2^ceil(log2 v), by exponent arithmetic
  int e = 0;
  const double m = std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1)
  return m == 0.5 ? std::ldexp(1.0, e - 1) : std::ldexp(1.0, e);
}

TEST(Fp8BlockScale, Mxfp8AndBlockwiseScalesArePowersOfTwoAsEachRuleSays) {
  std::vector<float> amaxes;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = std::bit_cast<float>(b << 16);
    if (v >= 0x1p-100f && v <= 0x1p100f) amaxes.push_back(v);
  }
  uint64_t state = 12345;
  for (int i = 0; i < 1'000'000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    amaxes.push_back(std::ldexp(1.0f + static_cast<float>(state >> 40) * 0x1p-24f,
                                static_cast<int>((state >> 20) % 200) - 100));
  }
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const double max = fp8_max(f);
    for (float amax : amaxes) {
      const Fp8BlockScale mx = fp8_block_scale(amax, Fp8BlockRule::kMxfp8, f);
      const double want_inv = power_of_two_at_least(amax / max);
      ASSERT_EQ(static_cast<double>(mx.scale_inv), want_inv) << amax;
      ASSERT_EQ(static_cast<double>(mx.scale), 1.0 / want_inv) << amax;
      ASSERT_LE(amax * static_cast<double>(mx.scale), max);
      const Fp8BlockScale bw = fp8_block_scale(amax, Fp8BlockRule::kBlockwise, f);
      const float quotient = static_cast<float>(max) / amax;
      ASSERT_LE(bw.scale, quotient) << amax;
      ASSERT_GT(2.0 * bw.scale, static_cast<double>(quotient)) << amax;
      ASSERT_EQ(power_of_two_at_least(bw.scale), static_cast<double>(bw.scale)) << amax;
      ASSERT_EQ(bw.scale_inv * bw.scale, 1.0f);
    }
  }
  // The edges, as TE's kernels have them. MXFP8: amax 0 (and anything up to 448 2^-127) gives
  // E8M0 code 0, whose multiplier exp2f_rcp makes 1 (the block's values round to 0); an infinite
  // amax gives code 254 and multiplier 0. Blockwise: 0, inf and NaN give scale 1; a quotient that
  // overflows f32 takes the largest finite value, rounded down to 2^127.
  const Fp8Format e4 = Fp8Format::kE4M3;
  EXPECT_EQ(fp8_block_scale(0.0f, Fp8BlockRule::kMxfp8, e4).scale, 1.0f);
  EXPECT_EQ(fp8_block_scale(0x1p-130f, Fp8BlockRule::kMxfp8, e4).scale, 1.0f);
  EXPECT_EQ(fp8_block_scale(0x1p-130f, Fp8BlockRule::kMxfp8, e4).scale_inv, 0x1p-127f);
  EXPECT_EQ(fp8_block_scale(INFINITY, Fp8BlockRule::kMxfp8, e4).scale, 0.0f);
  EXPECT_EQ(fp8_block_scale(INFINITY, Fp8BlockRule::kMxfp8, e4).scale_inv, 0x1p127f);
  EXPECT_EQ(fp8_block_scale(448.0f, Fp8BlockRule::kMxfp8, e4).scale, 1.0f);  // exactly in range
  EXPECT_EQ(fp8_block_scale(449.0f, Fp8BlockRule::kMxfp8, e4).scale, 0.5f);
  for (float edge : {0.0f, INFINITY, NAN}) {
    EXPECT_EQ(fp8_block_scale(edge, Fp8BlockRule::kBlockwise, e4).scale, 1.0f) << edge;
  }
  EXPECT_EQ(fp8_block_scale(1e-44f, Fp8BlockRule::kBlockwise, e4).scale, 0x1p127f);
  EXPECT_EQ(fp8_block_scale(448.0f, Fp8BlockRule::kBlockwise, e4).scale, 1.0f);
  EXPECT_EQ(fp8_block_scale(449.0f, Fp8BlockRule::kBlockwise, e4).scale, 0.5f);
  EXPECT_EQ(fp8_block_scale(3.0f, Fp8BlockRule::kBlockwise, e4).scale, 128.0f);  // 149.3 -> 128
}

}  // namespace
}  // namespace megatron
