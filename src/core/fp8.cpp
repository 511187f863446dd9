// FP8 codecs (core/fp8.h): a code is read off the value fp8_round gives.
#include "core/fp8.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace megatron {
namespace {

struct Layout {
  int mantissa_bits;
  int bias;
  float max_finite;
  float min_normal;
};

constexpr Layout kE4M3{3, 7, 448.0f, 0x1p-6f};
constexpr Layout kE5M2{2, 15, 57344.0f, 0x1p-14f};

const Layout& layout(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? kE4M3 : kE5M2;
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
}

float fp8_max(Fp8Format f) {
  return layout(f).max_finite;
}

uint8_t fp8_encode(float x, Fp8Format f) {
  const Layout& l = layout(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float r = std::fabs(fp8_round(x, f));
  if (r == 0.0f) return sign;
  const int m = l.mantissa_bits;
  if (r < l.min_normal) {  // subnormal: mantissa = r / spacing, exponent field 0
    const float spacing = l.min_normal / static_cast<float>(1 << m);
    return sign | static_cast<uint8_t>(r / spacing);
  }
  int e = 0;
  const float frac = std::frexp(r, &e);  // r = frac 2^e, frac in [0.5, 1)
  const int exponent_field = e - 1 + l.bias;
  const int mantissa = static_cast<int>(std::ldexp(frac, m + 1)) - (1 << m);
  return sign | static_cast<uint8_t>((exponent_field << m) | mantissa);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Layout& l = layout(f);
  const int m = l.mantissa_bits;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int magnitude = code & 0x7F;
  const int exponent_field = magnitude >> m, mantissa = magnitude & ((1 << m) - 1);
  if (f == Fp8Format::kE4M3 && magnitude == 0x7F) return std::nanf("");
  if (f == Fp8Format::kE5M2 && exponent_field == 31)
    return mantissa == 0 ? sign * INFINITY : std::nanf("");
  if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - l.bias - m);
  return sign * std::ldexp(static_cast<float>((1 << m) + mantissa), exponent_field - l.bias - m);
}

const float* fp8_decode_table(Fp8Format f) {
  struct Tables {
    float t[2][256];
    Tables() {
      for (int c = 0; c < 256; ++c) {
        t[0][c] = fp8_decode(static_cast<uint8_t>(c), Fp8Format::kE4M3);
        t[1][c] = fp8_decode(static_cast<uint8_t>(c), Fp8Format::kE5M2);
      }
    }
  };
  static const Tables tables;  // built once, read-only after: safe from every thread
  return tables.t[f == Fp8Format::kE4M3 ? 0 : 1];
}

namespace {

// TE's float_to_e8m0 (util/ptx.cuh, its bit-level form of cvt.rp.satfinite.ue8m0x2.f32).
uint32_t float_to_e8m0(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  uint32_t exponent = (bits >> 23) & 0xFF;
  const uint32_t mantissa = bits & 0x7FFFFF;
  // Round up, saturating at 254; a subnormal rounds up to 2^-126 only above 2^-127.
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return exponent;
}

float power_of_two(int e) {  // by the exponent's bits where 2^e is a normal float (it is called
                             // once per block of 32 elements: ldexp would cost as much as them)
  return e >= -126 && e <= 127 ? std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23)
                               : std::ldexp(1.0f, e);
}

}  // namespace

Fp8BlockScale fp8_block_scale(float amax, Fp8BlockRule rule, Fp8Format f) {
  const float max = fp8_max(f);
  if (rule == Fp8BlockRule::kMxfp8) {
    const uint32_t e = float_to_e8m0(amax * (1.0f / max));
    const float scale = e == 0 ? 1.0f : e >= 254 ? 0.0f : power_of_two(127 - static_cast<int>(e));
    return {scale, e == 255 ? NAN : power_of_two(static_cast<int>(e) - 127)};
  }
  if (amax == 0.0f || !std::isfinite(amax)) return {1.0f, 1.0f};
  float s = max / amax;
  if (std::isinf(s)) s = 0x1p127f;  // the input dtype's largest value, rounded down below
  s = std::bit_cast<float>(std::bit_cast<uint32_t>(s) & 0xFF800000u);
  return {s, 1.0f / s};
}

const char* fp8_block_rule_name(Fp8BlockRule rule) {
  return rule == Fp8BlockRule::kMxfp8 ? "mxfp8" : "blockwise";
}

}  // namespace megatron
