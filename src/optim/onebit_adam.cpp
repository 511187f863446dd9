// 1-bit Adam's step (optim/onebit_adam.h): f32 loops over the host buffers, the moments of each
// parameter updated in place, the compressed exchange per parameter tensor as DeepSpeed does it.
#include "optim/onebit_adam.h"

#include <cmath>

#include "core/error.h"

namespace megatron {

OneBitAdam::OneBitAdam(ParamSet& params, const AdamWConfig& cfg, int64_t freeze_step,
                       ProcessGroup& dp)
    : AdamW(params, cfg), freeze_step_(freeze_step), dp_(dp) {
  MEGATRON_CHECK(freeze_step >= 1, "--onebit-freeze-step must be at least 1, got ", freeze_step);
  MEGATRON_CHECK(params.main().device() == Device::kCPU,
                 "1-bit Adam runs on the CPU device (its compressed exchange packs signs on the "
                 "host): use --device cpu, or --optimizer adam");
}

void OneBitAdam::set_steps(int64_t steps) {
  AdamW::set_steps(steps);
  compressing_ = steps >= freeze_step_;
  errors_.clear();
}

void OneBitAdam::step(const StepRates& rates, double grad_scale) {
  ++step_;
  if (step_ == 1) return;  // DeepSpeed's initialisation call: nothing moves
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps);

  float* main = params_.main().data<float>();
  const float* grads = params_.grads().data<float>();
  float* m_all = exp_avg_.data<float>();
  float* v_all = exp_avg_sq_.data<float>();
  for (Param* p : params_.params()) {
    if (p->frozen) continue;  // not trained
    const int64_t off = params_.offset_of(*p), n = p->shape.numel();
    float* w = main + off;
    float* m = m_all + off;
    float* v = v_all + off;
    const float* g = grads + off;
    const float lr = static_cast<float>(rates.lr_of(*p));
    const float wd = static_cast<float>(rates.decay_of(*p));
    // The clipping factor rounded to f32 and applied to each gradient as an in-place scaling
    // would (the separate norm group's own, if any).
    const float gs = static_cast<float>(rates.grad_scale_of(*p, grad_scale));
    if (!compressing_) {
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] * gs;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) m[i] = b1 * m[i] + (1.0f - b1) * (g[i] * gs);
      auto it = errors_.find(p);
      if (it == errors_.end())
        it = errors_.emplace(p, CompressionErrors::zeros(n, dp_.size())).first;
      compressed_allreduce(m, n, it->second, dp_);
      // DeepSpeed's exp_avg_mask, from the frozen variance: an element that had no gradient in
      // the whole warm-up (v = 0: padded vocabulary rows, unused positions) keeps a zero
      // momentum. The 1-bit exchange cannot send an exact zero, and +-scale / eps would move it
      // by lr x 1e4 a step. v is the same on every rank, so is the mask.
      for (int64_t i = 0; i < n; ++i)
        if (v[i] == 0.0f) m[i] = 0.0f;
    }
    for (int64_t i = 0; i < n; ++i) {
      float update = m[i] / (std::sqrt(v[i]) + eps);
      if (wd > 0.0f) update += wd * w[i];
      w[i] += -lr * update;
    }
  }
  params_.sync_compute_from_main();
  if (!compressing_ && step_ >= freeze_step_) compressing_ = true;
}

}  // namespace megatron
