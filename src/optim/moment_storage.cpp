// The precision-aware optimizer's moment storage: Transformer Engine FusedAdam's scaling rules
// (see the header), composed from the tensor ops so that it runs on every device.
#include "optim/moment_storage.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

namespace {
DType storage_dtype(MomentDType t) {
  switch (t) {
    case MomentDType::kF16:
      return DType::kF16;
    case MomentDType::kBF16:
      return DType::kBF16;
    case MomentDType::kFP8:
      return DType::kU8;
    default:
      return DType::kF32;
  }
}

}  // namespace

bool parse_moment_dtype(const std::string& s, MomentDType* out) {
  if (s == "fp32") {
    *out = MomentDType::kF32;
  } else if (s == "fp16") {
    *out = MomentDType::kF16;
  } else if (s == "bf16") {
    *out = MomentDType::kBF16;
  } else if (s == "fp8") {
    *out = MomentDType::kFP8;
  } else {
    return false;
  }
  return true;
}

const char* moment_dtype_name(MomentDType t) {
  switch (t) {
    case MomentDType::kF16:
      return "fp16";
    case MomentDType::kBF16:
      return "bf16";
    case MomentDType::kFP8:
      return "fp8";
    default:
      return "fp32";
  }
}

int64_t moment_element_bytes(MomentDType t) {
  return static_cast<int64_t>(dtype_size(storage_dtype(t)));
}

MomentStorage::MomentStorage(int64_t numel, MomentDType dtype, DType wide, Device device,
                             std::vector<std::pair<int64_t, int64_t>> groups)
    : dtype_(dtype),
      data_(
          Tensor::zeros({numel}, dtype == MomentDType::kF32 ? wide : storage_dtype(dtype), device)),
      groups_(std::move(groups)),
      read_scale_(groups_.size(), 1.0f) {
  MEGATRON_CHECK(dtype == MomentDType::kF32 || wide == DType::kF32, "Adam moments in ",
                 moment_dtype_name(dtype), " need f32 main weights, got ", dtype_name(wide));
  for (const auto& [b, e] : groups_)
    MEGATRON_CHECK(0 <= b && b <= e && e <= numel, "MomentStorage: group [", b, ", ", e,
                   ") outside [0, ", numel, ")");
}

Tensor MomentStorage::group(int64_t k) const {
  const auto [b, e] = groups_[static_cast<size_t>(k)];
  return data_.flat_view(b, {e - b});
}

Tensor MomentStorage::unscaled(int64_t k) const {
  Tensor stored = group(k);
  if (dtype_ == MomentDType::kF32) return stored.clone();
  Tensor out = Tensor::empty(stored.shape(), DType::kF32, stored.device());
  float read = read_scale(k);
  ops::unscale_moment(out, {&stored, &read});
  return out;
}

void MomentStorage::store(int64_t k, Tensor& values) {
  Tensor stored = group(k);
  MEGATRON_CHECK(values.numel() == stored.numel(), "MomentStorage::store: expected ",
                 stored.numel(), " values, got ", values.str());
  // FusedAdam's _apply_scale: the scaling from the new values' absmax.
  ops::store_moment({&stored, &read_scale_[static_cast<size_t>(k)]}, values);
}

Tensor MomentStorage::to_f32() const {
  if (dtype_ == MomentDType::kF32) return data_.clone();
  Tensor out = Tensor::zeros({numel()}, DType::kF32, data_.device());
  for (int64_t k = 0; k < num_groups(); ++k) {
    const auto [b, e] = groups_[static_cast<size_t>(k)];
    Tensor dst = out.flat_view(b, {e - b});
    dst.copy_from(unscaled(k));
  }
  return out;
}

void MomentStorage::from_f32(const Tensor& values) {
  MEGATRON_CHECK(values.numel() == numel(), "MomentStorage::from_f32: expected ", numel(),
                 " values, got ", values.str());
  for (int64_t k = 0; k < num_groups(); ++k) {
    const auto [b, e] = groups_[static_cast<size_t>(k)];
    Tensor v = values.flat_view(b, {e - b}).clone();
    store(k, v);
  }
}

}  // namespace megatron
