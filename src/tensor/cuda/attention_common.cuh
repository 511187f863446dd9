// What both attention kernels (attention.cu on CUDA cores, flash_attention.cu on tensor cores)
// read the same way: an element of a strided q/k/v view, which keys a query sees, and the dropout
// keep-scale from the Philox counters every device uses.
#pragma once

#include "tensor/cuda/common.cuh"

namespace megatron::cuda {

// Offset of channel 0 of row t, sequence bb, head `head` of a view.
__device__ inline int64_t view_at(const AttnView& v, int64_t t, int64_t bb, int64_t head) {
  const int64_t g = head / v.per_group, p = head % v.per_group;
  return v.offset + t * v.stride_s + bb * v.stride_b + g * v.stride_g + p * v.stride_p;
}

// Whether query i sees key j (ops.h's AttentionSpec): in range, causal, document and padding.
__device__ inline bool visible(const AttnArgs& a, int64_t bb, int64_t i, int64_t j) {
  const int64_t sq = a.q.s, skv = a.k.s;
  if (i >= sq || j >= skv) return false;
  const int64_t ig = a.q_offset + i, jg = a.kv_offset + j;
  if (a.causal && jg > ig) return false;
  if (a.doc_start && jg < a.doc_start[bb * sq + i]) return false;
  if (a.window >= 0 && jg < ig - a.window) return false;
  if (a.key_valid && a.key_valid[bb * skv + j] == 0) return false;
  return true;
}

// The dropout keep-scale of (bb, h, i, j): 0 or 1 / (1 - p).
template <typename T>
__device__ inline T keep_scale(const AttnArgs& a, int64_t bb, int64_t h, int64_t i, int64_t j) {
  if (a.dropout <= 0.0f) return T(1);
  const int64_t heads = a.total_heads > 0 ? a.total_heads : a.np;
  const int64_t qpos = a.q_positions > 0 ? a.q_positions : a.q.s;
  const int64_t kvpos = a.kv_positions > 0 ? a.kv_positions : a.k.s;
  const uint64_t idx = static_cast<uint64_t>(
      ((bb * heads + a.head_offset + h) * qpos + a.q_offset + i) * kvpos + a.kv_offset + j);
  return philox_uniform(a.seed, a.stream, idx) >= a.dropout
             ? static_cast<T>(1.0 / (1.0 - static_cast<double>(a.dropout)))
             : T(0);
}

// Raises a.max_logit[h] to x (AttentionSpec::max_logit; a no-op without one). Floats compare
// as their bit patterns do as signed integers when the sign bit is clear and in reverse as
// unsigned ones when it is set (-0.0 included), so one integer atomic does it (the slot starts at
// -inf or a real score).
__device__ inline void raise_max_logit(const AttnArgs& a, int64_t h, float x) {
  if (!a.max_logit) return;
  float* slot = a.max_logit + h;
  if (__float_as_int(x) >= 0) {
    atomicMax(reinterpret_cast<int*>(slot), __float_as_int(x));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(slot), __float_as_uint(x));
  }
}

}  // namespace megatron::cuda
