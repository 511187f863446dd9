// Forward and backward of one rank's model chunks per micro-batch, and the last stage's loss.
#include "train/micro_batch_runner.h"

#include <algorithm>

#include "tensor/ops.h"

namespace megatron {

MicroBatchRunner::MicroBatchRunner(const std::vector<std::unique_ptr<GPTModel>>& chunks,
                                   std::vector<GPTBatch> batches,
                                   std::function<ForwardMode(int)> mode, bool training,
                                   GradBuckets* buckets, double loss_scale)
    : chunks_(chunks),
      batches_(std::move(batches)),
      mode_(std::move(mode)),
      training_(training),
      buckets_(buckets),
      loss_scale_(loss_scale),
      ctx_(chunks.size(), std::vector<GPTModel::Ctx>(batches_.size())),
      dloss_(batches_.size()) {}

Tensor MicroBatchRunner::forward(int microbatch, int chunk, const Tensor& input) {
  const GPTModel& model = *chunks_[chunk];
  const GPTBatch& b = batches_[microbatch];
  GPTModel::Ctx& ctx = ctx_[chunk][microbatch];
  Tensor out = model.forward_stage(input, GPTInputs{b.tokens, b.labels, b.positions, b.doc_start},
                                   ctx, mode_(microbatch));
  if (!model.stage().post_process) {
    if (!training_) ctx = GPTModel::Ctx{};
    return out;
  }
  const float* lp = out.data<float>();
  const float* mp = b.loss_mask.data<float>();
  double sum = 0, count = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    sum += static_cast<double>(lp[i]) * mp[i];
    count += mp[i];
  }
  loss_sum_ += sum;
  token_count_ += count;
  if (training_) {
    Tensor dloss = b.loss_mask.clone();
    const auto m = static_cast<double>(batches_.size());
    ops::scale_inplace(dloss, loss_scale_ / (std::max(count, 1.0) * m));
    dloss_[microbatch] = dloss;
  } else {
    ctx = GPTModel::Ctx{};
  }
  return Tensor();
}

Tensor MicroBatchRunner::backward(int microbatch, int chunk, const Tensor& doutput) {
  const GPTModel& model = *chunks_[chunk];
  Tensor d = model.stage().post_process ? dloss_[microbatch] : doutput;
  // Every schedule runs a chunk's backwards in micro-batch order: the last one finishes its
  // gradients.
  ParamsDone done;
  if (buckets_ && microbatch == static_cast<int>(batches_.size()) - 1) {
    done = [this](const std::vector<const Param*>& ps) {
      for (const Param* p : ps) buckets_->mark_ready(*p);
      buckets_->poll();
    };
  }
  Tensor dx = model.backward_stage(d, ctx_[chunk][microbatch], done);
  if (model.stage().post_process) dloss_[microbatch] = Tensor();
  return dx;
}

}  // namespace megatron
