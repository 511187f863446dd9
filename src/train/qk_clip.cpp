#include "train/qk_clip.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace megatron {

QkClipper::QkClipper(std::vector<SelfAttention*> attentions, const QkClip& clip, bool clip_weights)
    : attentions_(std::move(attentions)), clip_(clip), clip_weights_(clip_weights) {}

QkClipper::Step QkClipper::finish(ProcessGroup& dp_cp, ProcessGroup& model_parallel) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  // One row of heads per layer, -inf for a layer no training forward reached.
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const SelfAttention* a : attentions_) {
    offsets.push_back(total);
    total += a->local_heads();
  }
  Tensor all = Tensor::full({std::max<int64_t>(total, 1)}, kNone, DType::kF32);
  for (size_t i = 0; i < attentions_.size(); ++i) {
    const Tensor& m = attentions_[i]->max_logits();
    if (m.defined()) all.flat_view(offsets[i], {m.numel()}).copy_from(m.to(Device::kCPU));
  }
  // Every replica holds the same layers and heads, so the rows line up.
  if (dp_cp.size() > 1) dp_cp.all_reduce(all, ReduceOp::kMax);
  float* m = all.data<float>();
  for (int64_t i = 0; i < total; ++i) m[i] = clip_.round(m[i]);

  Step step;
  Tensor top = Tensor::full({1}, kNone, DType::kF64);
  for (int64_t i = 0; i < total; ++i)
    top.data<double>()[0] = std::max(top.data<double>()[0], static_cast<double>(m[i]));
  if (model_parallel.size() > 1) model_parallel.all_reduce(top, ReduceOp::kMax);
  step.max_logit = top.data<double>()[0];

  for (size_t i = 0; i < attentions_.size(); ++i) {
    SelfAttention& a = *attentions_[i];
    if (clip_weights_) {
      std::vector<float> heads(m + offsets[i], m + offsets[i] + a.local_heads());
      for (RowScale& r : a.qk_clip_scales(heads, clip_)) step.scales.push_back(std::move(r));
    }
    a.reset_max_logits();
  }
  return step;
}

}  // namespace megatron
