// MomentStorage: one Adam moment of the precision-aware optimizer (--use-precision-aware-optimizer
// with --exp-avg-dtype / --exp-avg-sq-dtype), stored as Transformer Engine's FusedAdam stores it
// for Megatron:
//
//   fp32  the values
//   bf16  the values rounded to bf16 (no scale)
//   fp16  value / scale rounded to fp16, one fp32 scale per group: after every update
//         scale = absmax / (65504 / 2) of the group's new fp32 values (the values are multiplied
//         by 1 / scale, 0 for an all-zero group); read back as fp16 x scale
//   fp8   E4M3 codes of value x (1 / scale) with scale = absmax / 448 (saturating); read back
//         as the code's value x 1 / (1 / scale), the inverse Transformer Engine's FP8 tensors keep
//
// A group is what FusedAdam sees as one parameter: under Megatron's distributed optimizer a
// Param's part of one owned shard (DistributedOptimizer's segments), so with fp16 or fp8 moments
// the rounding depends on the data-parallel layout, as in Megatron; fp32 and bf16 ones do not.
// Elements outside every group (a shard's padding) stay zero.
//
// The kernel arithmetic is fp32 for every storage (FusedAdam reads the moments widened and
// unscaled, updates them in fp32 and stores them back): ops::adamw_step_scaled reads and writes
// every storage itself (for_step); unscaled() and store() compose the same from the tensor ops.
// Checkpoints hold the unscaled fp32 values (FusedAdam's state_dict), so they load into any storage
// and any layout; a checkpoint written from fp16 or fp8 moments re-derives the scales on load (bits
// can differ from the uninterrupted run there: the scales are not saved, as in Megatron).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace megatron {

enum class MomentDType : uint8_t { kF32, kF16, kBF16, kFP8 };
// "fp32", "fp16", "bf16", "fp8" (Megatron's spellings); false for anything else.
bool parse_moment_dtype(const std::string& s, MomentDType* out);
const char* moment_dtype_name(MomentDType t);
// Bytes per stored element: 4, 2, 2, 1.
int64_t moment_element_bytes(MomentDType t);

class MomentStorage {
 public:
  MomentStorage() = default;
  // numel zeros (scales 1, FusedAdam's start) in `dtype` on `device`; groups: the [begin, end)
  // element ranges that each have one scale, disjoint. fp32 storage takes `wide`, the main
  // weights' dtype (f32; f64 in the reference computations); the others need f32 weights.
  MomentStorage(int64_t numel, MomentDType dtype, DType wide, Device device,
                std::vector<std::pair<int64_t, int64_t>> groups);

  MomentDType dtype() const { return dtype_; }
  // fp16 and fp8 keep scales; an update then goes through ops::adamw_step_scaled (for_step).
  bool scaled() const { return dtype_ == MomentDType::kF16 || dtype_ == MomentDType::kFP8; }
  int64_t numel() const { return data_.numel(); }
  int64_t nbytes() const { return static_cast<int64_t>(data_.nbytes()); }
  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  // The stored elements of group k (f32, bf16, f16 or u8 codes): what ops::adamw_step updates in
  // place for fp32 and bf16 storage.
  Tensor group(int64_t k) const;
  // The whole stored buffer (groups and padding).
  const Tensor& whole() const { return data_; }
  // Group k's values in fp32: a new tensor for every storage (an update writes it, then store()).
  Tensor unscaled(int64_t k) const;
  // Stores fp32 `values` (group k's size) with a new scale from their absmax. Scales `values` in
  // place (as FusedAdam's _apply_scale does) for fp16 and fp8.
  void store(int64_t k, Tensor& values);
  // The scale group k's values are read with: fp16's scale, fp8's 1 / (1 / scale); 1 otherwise.
  float read_scale(int64_t k) const { return read_scale_[static_cast<size_t>(k)]; }
  // Group k as ops::adamw_step_scaled updates it in place (its scale replaced by the step's).
  ops::StoredMoment for_step(int64_t k, Tensor& view) {
    view = group(k);
    return {&view, &read_scale_[static_cast<size_t>(k)]};
  }

  // Every element in fp32 (padding 0): what a checkpoint saves.
  Tensor to_f32() const;
  // Stores every group from fp32 values [numel()] (a checkpoint loaded), scales re-derived.
  void from_f32(const Tensor& values);

 private:
  MomentDType dtype_ = MomentDType::kF32;
  Tensor data_;
  std::vector<std::pair<int64_t, int64_t>> groups_;
  std::vector<float> read_scale_;
};

}  // namespace megatron
