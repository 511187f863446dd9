// Dtype sizes and names, and element-wise conversions between the floating types.
#include "core/dtype.h"

#include "core/error.h"

namespace megatron {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  MEGATRON_ASSERT(false, "unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

namespace {
// Loads element i of a floating buffer as double (exact for every supported type).
double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const f16*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      break;  // bytes, not numbers: convert() refuses them
  }
  return 0;
}
}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_type));
    return;
  }
  MEGATRON_CHECK(dst_type != DType::kU8 && src_type != DType::kU8,
                 "u8 tensors hold raw bytes (FP8 codes) and convert to no other dtype");
  // Fast paths for the conversions the trainer does every step.
  if (src_type == DType::kF32 && dst_type == DType::kBF16) {
    const float* s = static_cast<const float*>(src);
    bf16* d = static_cast<bf16*>(dst);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (src_type == DType::kBF16 && dst_type == DType::kF32) {
    const bf16* s = static_cast<const bf16*>(src);
    float* d = static_cast<float*>(dst);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    double v = load(src, src_type, i);
    switch (dst_type) {
      case DType::kF32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::kF64:
        static_cast<double*>(dst)[i] = v;
        break;
      case DType::kBF16:
        static_cast<bf16*>(dst)[i] = f32_to_bf16(static_cast<float>(v));
        break;
      case DType::kF16:
        static_cast<f16*>(dst)[i] = f32_to_f16(static_cast<float>(v));
        break;
      case DType::kI32:
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
        break;
      case DType::kI64:
        static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
        break;
      case DType::kU8:
        break;  // refused above
    }
  }
}

}  // namespace megatron
