// MicroBatchRunner: what one rank computes for the micro-batches of a training or evaluation
// step, handed to the pipeline executor (pipeline/executor.h): the forward and backward of this
// rank's model chunks, and, on the last stage, Megatron's loss.
//
// The objective of a micro-batch is its masked mean token loss divided by the number of
// micro-batches, so the gradients of a step sum to the gradient of the global-batch mean (as in
// Megatron); the reported loss is token-weighted over the whole global batch (sum of masked
// losses / masked tokens), as Megatron's train_step reduces it. Without pipelining the executor
// runs forward and backward of each micro-batch back to back through this same runner.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "data/gpt_batch.h"
#include "models/gpt_model.h"
#include "parallel/grad_buckets.h"
#include "pipeline/executor.h"

namespace megatron {

class MicroBatchRunner final : public StageRunner {
 public:
  // chunks: this rank's model chunks (virtual stages), outliving the runner. batches: the step's
  // micro-batches as far as this stage reads them (undefined tensors where it does not).
  // buckets (optional): told of each gradient that the step's last backward of a chunk
  // finishes, so that data-parallel reductions overlap the rest of backward. loss_scale: the
  // fp16 loss scale the objective is multiplied by before backward (1 otherwise).
  // mode(mb): the forward mode (training flag, dropout stream) of micro-batch mb. training:
  // keep activations and compute the loss gradient for backward.
  MicroBatchRunner(const std::vector<std::unique_ptr<GPTModel>>& chunks,
                   std::vector<GPTBatch> batches, std::function<ForwardMode(int)> mode,
                   bool training, GradBuckets* buckets = nullptr, double loss_scale = 1.0);

  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& doutput) override;

  // On the last stage: the sum of masked token losses and the number of masked tokens so far.
  double loss_sum() const { return loss_sum_; }
  double token_count() const { return token_count_; }

 private:
  const std::vector<std::unique_ptr<GPTModel>>& chunks_;
  std::vector<GPTBatch> batches_;
  std::function<ForwardMode(int)> mode_;
  bool training_;
  GradBuckets* buckets_;
  double loss_scale_;
  std::vector<std::vector<GPTModel::Ctx>> ctx_;  // [chunk][microbatch]
  std::vector<Tensor> dloss_;                    // [microbatch], last stage
  double loss_sum_ = 0, token_count_ = 0;
};

}  // namespace megatron
