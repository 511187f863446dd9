// MicroBatchRunner: what one rank computes for the micro-batches of a training or evaluation
// step, handed to the pipeline executor (pipeline/executor.h): the forward and backward of this
// rank's model chunks, and, on the last stage, the model's loss (LossFn).
//
// The objective of a micro-batch is its first loss term's mean divided by the number of
// micro-batches, so the gradients of a step sum to the gradient of the global-batch mean (as in
// Megatron); the reported terms are weighted over the whole global batch (sums over sums of
// counts), as Megatron's train_step reduces them. Without pipelining the executor runs forward
// and backward of each micro-batch back to back through this same runner. Any model: chunks and
// loss come from its spec.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "models/model_chunk.h"
#include "parallel/fsdp.h"
#include "parallel/grad_buckets.h"
#include "pipeline/executor.h"

namespace megatron {

class MicroBatchRunner final : public StageRunner {
 public:
  // chunks: this rank's model chunks (virtual stages), outliving the runner; loss: the model's
  // loss, used on the last stage. batches: the step's micro-batches as far as this rank's chunks
  // read them (empty maps where they read nothing). buckets (optional): told of each gradient
  // that the step's last backward of a chunk finishes, so that data-parallel reductions overlap
  // the rest of backward. loss_scale: the fp16 loss scale the objective is multiplied by before
  // backward (1 otherwise). mode(mb): the forward mode (training flag, dropout stream) of
  // micro-batch mb. training: keep activations and compute the loss gradient for backward.
  MicroBatchRunner(const std::vector<std::unique_ptr<ModelChunk>>& chunks, const LossFn& loss,
                   int64_t micro_batch_size, std::vector<TensorMap> batches,
                   std::function<ForwardMode(int)> mode, bool training,
                   GradBuckets* buckets = nullptr, double loss_scale = 1.0);

  std::vector<TensorSpec> recv_specs(int chunk) const override;
  std::vector<TensorSpec> send_specs(int chunk) const override;
  TensorMap forward(int microbatch, int chunk, const TensorMap& input) override;
  TensorMap backward(int microbatch, int chunk, const TensorMap& doutput) override;

  // The loss terms of the micro-batches so far (sums and counts): the loss on the last stage,
  // and whatever auxiliary terms this rank's chunks add.
  const LossTerms& losses() const { return losses_; }
  // --calculate-per-token-loss: the loss's objective is its token sum (ObjectiveScale).
  void set_per_token_loss(bool on) { per_token_ = on; }
  // --sft: the loss terms report each micro-batch's mean as one unit (sum / count, 1), so that
  // the logged value is the mean of the micro-batches' means, as Megatron reports SFT losses
  // (training.py, "normalization happens on micro batch"); a micro-batch without loss tokens
  // adds nothing.
  void set_report_microbatch_means(bool on) { microbatch_means_ = on; }
  // Megatron-FSDP's sharded strategies: every backward (not only the last micro-batch's) tells
  // the runtime which parameters it starts and finishes, so that it lends and reduces them.
  void set_fsdp(FsdpRuntime* fsdp) { fsdp_ = fsdp; }
  // Training, last stage: called with each micro-batch's local loss sum (the first term's, this
  // rank's tokens, before any reduction), where Megatron's loss function validates it.
  void set_loss_check(std::function<void(double)> f) { loss_check_ = std::move(f); }

 private:
  const std::vector<std::unique_ptr<ModelChunk>>& chunks_;
  const LossFn& loss_;
  int64_t micro_batch_size_;
  std::vector<TensorMap> batches_;
  std::function<ForwardMode(int)> mode_;
  bool training_;
  GradBuckets* buckets_;
  FsdpRuntime* fsdp_ = nullptr;
  std::function<void(double)> loss_check_;
  double loss_scale_;
  bool per_token_ = false;
  bool microbatch_means_ = false;
  std::vector<std::vector<std::unique_ptr<ModelChunk::Ctx>>> ctx_;  // [chunk][microbatch]
  std::vector<TensorMap> dloss_;  // [microbatch], last stage: the loss's gradient
  LossTerms losses_;
};

}  // namespace megatron
