// 1-bit Adam (DeepSpeed's OnebitAdam, arXiv 2102.02888; not in Megatron, so its flags are ours:
// --optimizer onebit_adam, --onebit-freeze-step, DeepSpeed's "OneBitAdam" with "freeze_step"),
// over the same flat moment buffers as AdamW, so checkpoints hold the same tensors.
//
// DeepSpeed's algorithm, step t counted from 1:
//   t = 1:      initialisation only: no update of the moments or the weights (the step's
//               gradient is dropped, as DeepSpeed's first call does).
//   warm-up:    (t <= freeze_step) the gradients are all-reduced (averaged) over data parallelism
//               as usual, then per parameter
//                 m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
//                 w -= lr (m / (sqrt(v) + eps) + wd w)          (no bias correction)
//   compressed: (t > freeze_step) v is frozen; no gradient all-reduce: each rank's own gradient
//               enters m = b1 m + (1 - b1) g, and m is replaced by its compressed average over the
//               data-parallel group (comm/compressed_allreduce.h, per parameter tensor, with each
//               tensor's worker and server errors), then w moves as above. Elements whose frozen
//               v is 0 (no gradient in the whole warm-up) keep m = 0: DeepSpeed's exp_avg_mask,
//               which DeepSpeed asks the user for, derived here from the variance.
// g is the gradient times the clipping coefficient. The compression errors are not saved:
// DeepSpeed resets them when a checkpoint loads, and the stage follows from the loaded step.
//
// Not with the distributed optimizer (DeepSpeed: "1bit-Adam is not compatible with ZeRO"): the
// compressed exchange needs every rank's whole momentum, which ZeRO shards; the trainer refuses
// the combination. Host (CPU device) buffers.
#pragma once

#include <unordered_map>

#include "comm/compressed_allreduce.h"
#include "optim/adamw.h"

namespace megatron {

class OneBitAdam : public AdamW {
 public:
  // dp: the group the momentum is averaged over (data x context parallel).
  OneBitAdam(ParamSet& params, const AdamWConfig& cfg, int64_t freeze_step, ProcessGroup& dp);

  using AdamW::step;
  void step(const StepRates& rates, double grad_scale = 1.0) override;
  // Restores the step count; the stage follows from it and the compression errors restart at 0.
  void set_steps(int64_t steps) override;
  // Whether the next step exchanges compressed momenta (then the gradients must not be reduced
  // over data parallelism: the trainer turns its gradient all-reduce off).
  bool compressing() const { return compressing_; }
  int64_t freeze_step() const { return freeze_step_; }

 private:
  int64_t freeze_step_;
  ProcessGroup& dp_;
  bool compressing_ = false;
  std::unordered_map<const Param*, CompressionErrors> errors_;
};

}  // namespace megatron
