// FP8 codecs (core/fp8.h). fp8_round works on the f32 bits: normal results round the mantissa to
// the format's width in place (an add of half an ulp, ties to even, then a mask), subnormal ones
// are rounded to multiples of the subnormal spacing by adding and subtracting a power of two
// whose f32 ulp is that spacing (the hardware's round-to-nearest-even does the rounding). The
// code is then read off the rounded value.
#include "core/fp8.h"

#include <cmath>
#include <cstring>

namespace megatron {
namespace {

struct Layout {
  int mantissa_bits;
  int bias;
  float max_finite;
  float min_normal;
  float subnormal_magic;  // 2^(min exponent - mantissa bits + 23): its ulp is the subnormal step
};

constexpr Layout kE4M3{3, 7, 448.0f, 0x1p-6f, 0x1p14f};
constexpr Layout kE5M2{2, 15, 57344.0f, 0x1p-14f, 0x1p7f};

const Layout& layout(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? kE4M3 : kE5M2;
}

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
}

float fp8_max(Fp8Format f) {
  return layout(f).max_finite;
}

float fp8_round(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const Layout& l = layout(f);
  const float a = std::fabs(x);
  float r;
  if (a < l.min_normal) {
    // IEEE arithmetic (no -ffast-math): the sum is rounded to f32 before the subtraction.
    r = (a + l.subnormal_magic) - l.subnormal_magic;
  } else {
    const int drop = 23 - l.mantissa_bits;
    uint32_t u = bits_of(a);
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
    u &= ~((1u << drop) - 1);
    r = from_bits(u);  // +inf when a was inf or rounded past FLT_MAX
  }
  r = std::fmin(r, l.max_finite);  // saturation
  return std::copysign(r, x);
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

}  // namespace megatron
