// FP8 codecs (core/fp8.h): a code is read off the value fp8_round gives.
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

}  // namespace megatron
