// QkClip: MuonClip's qk-clip rule (Megatron core 0.19's Attention.clip_qk and
// MLASelfAttention.clip_qk, --qk-clip). After a step in which a query group's (MLA: a head's)
// largest attention score m exceeded the threshold t, its query and key weights shrink:
//
//   eta = min(1, t / m),   query rows x eta^alpha,   key rows x eta^(1 - alpha)
//
// (MLA: the rotary query rows x eta, since their key is shared by every head; the values never),
// so that the step's scores would have stayed at most t. Nothing changes in a layer where no
// group exceeded t.
//
// The arithmetic is torch's on the statistic as Transformer Engine returns it: m rounded to the
// activations' dtype (bf16 in bf16 runs), t / m as reciprocal(m) x t, the power with its
// exponent cast to that dtype and through sqrt for 0.5, each result rounded to that dtype; the
// f32 main weights are then multiplied by those values.
#pragma once

#include "core/dtype.h"

namespace megatron {

struct QkClip {
  double alpha = 0.5, threshold = 100;
  DType dtype = DType::kF32;  // of the attention's activations: f32, bf16 or f16

  // x rounded to dtype (as a float).
  float round(double x) const;
  // Whether a group with largest score m (already in dtype) is clipped.
  bool exceeds(float m) const;
  // eta of a group with largest score m.
  float eta(float m) const;
  // eta^e in dtype.
  float power(float eta, double e) const;
};

}  // namespace megatron
