// QkClipper: the trainer's side of --qk-clip and --log-max-attention-logit (Megatron core 0.19's
// clip_qk, run after each optimizer step as part of the MuonClip step).
//
// Every training forward raises each decoder self-attention head's largest score
// (SelfAttention::max_logits). Once a step's forwards and backwards are done, finish():
//   1. gathers them, one [heads] row per layer on this rank, and takes their max over the data-
//      and context-parallel replicas (one all-reduce; tensor-parallel ranks keep their own heads,
//      pipeline stages their own layers), rounded to the activations' dtype as Transformer
//      Engine returns the statistic;
//   2. with --log-max-attention-logit or --qk-clip, the largest of them over the whole model
//      (a max over the model-parallel group) for the iteration line and TensorBoard;
//   3. with --qk-clip, each layer's row factors (SelfAttention::qk_clip_scales), which the
//      optimizer applies to the updated main weights (parallel/row_scale.h): Megatron clips the
//      weights right after optimizer.step(), the same product;
//   4. resets every layer's statistic for the next step.
// Collective over every rank (each calls it once per step, skipped fp16 steps included: Megatron
// clips after those too).
#pragma once

#include <vector>

#include "comm/process_group.h"
#include "parallel/row_scale.h"
#include "transformer/attention.h"
#include "transformer/qk_clip.h"

namespace megatron {

class QkClipper {
 public:
  // attentions: this rank's decoder self-attention layers in model order (every replica lists
  // the same ones); clip_weights: --qk-clip (else the statistic is only logged).
  QkClipper(std::vector<SelfAttention*> attentions, const QkClip& clip, bool clip_weights);

  struct Step {
    double max_logit = 0;          // over the whole model (-inf: no attention saw a key)
    std::vector<RowScale> scales;  // empty unless a group exceeded the threshold
  };
  Step finish(ProcessGroup& dp_cp, ProcessGroup& model_parallel);

 private:
  std::vector<SelfAttention*> attentions_;
  QkClip clip_;
  bool clip_weights_;
};

}  // namespace megatron
