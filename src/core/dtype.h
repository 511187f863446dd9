// Element types and their conversions: f32, f64 (references), bf16, f16 (storage), int32/int64 ids,
// u8 (raw bytes: the codes of FP8 primary weights, which are never converted to or from a number).
//
// bf16 and f16 are storage formats here: kernels convert to f32 to compute. Conversions to bf16
// round to nearest even (NaN stays NaN), the rounding every framework and oneDNN use.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace megatron {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
// The 16-bit float storage formats (compute weights of --bf16 and --fp16 runs).
inline bool is_half(DType t) {
  return t == DType::kBF16 || t == DType::kF16;
}

// Brain float: the top 16 bits of an IEEE f32.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN, never rounds to inf
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// IEEE half precision, stored as bits; GCC's _Float16 does the exact conversions.
struct f16 {
  uint16_t bits;
};

inline float f16_to_f32(f16 x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}

inline f16 f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  f16 r;
  std::memcpy(&r.bits, &h, 2);
  return r;
}

// Converts n elements between any two floating dtypes (f32, f64, bf16, f16).
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

}  // namespace megatron
