// The two 8-bit floating-point formats of FP8 training, as the OCP 8-bit floating point
// specification defines them (CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2, Transformer Engine's
// kFloat8E4M3 / kFloat8E5M2):
//
//             sign exp man  bias  max finite   min normal  min subnormal  inf        NaN
//   E4M3        1   4   3     7   448 (0x7E)   2^-6        2^-9           none       S.1111.111
//   E5M2        1   5   2    15   57344 (0x7B) 2^-14       2^-16          S.11111.00 S.11111.xx
//
// Conversion from f32 is the one Transformer Engine's casts use: round to nearest, ties to even,
// saturating (__NV_SATFINITE): a finite value beyond the largest finite code, and +-inf, become
// +-max finite; NaN stays NaN. These are codecs only; the scaling that maps a tensor into the
// format's range is parallel/fp8_scaling.h's.
//
// Every FP8 value is exact in bf16 (at most 3 mantissa bits, exponents 2^-16 .. 2^15), so the CPU
// keeps quantised tensors as bf16 holding FP8 values and multiplies them with its bf16 GEMM: the
// products and f32 sums of an FP8 GEMM, without a byte format of its own.
#pragma once

#include <cstdint>

namespace megatron {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

const char* fp8_format_name(Fp8Format f);  // "e4m3", "e5m2"
float fp8_max(Fp8Format f);                // 448, 57344

// The code of x (RNE, saturating; NaN -> 0x7F with x's sign).
uint8_t fp8_encode(float x, Fp8Format f);
// The value of a code (E4M3 has no infinities; NaN codes give NaN).
float fp8_decode(uint8_t code, Fp8Format f);
// fp8_decode(fp8_encode(x)) without the code: what the quantisation kernels use.
float fp8_round(float x, Fp8Format f);

}  // namespace megatron
