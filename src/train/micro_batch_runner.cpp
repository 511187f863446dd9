// Forward and backward of one rank's model chunks per micro-batch, and the last stage's loss.
#include "train/micro_batch_runner.h"

namespace megatron {

MicroBatchRunner::MicroBatchRunner(const std::vector<std::unique_ptr<ModelChunk>>& chunks,
                                   const LossFn& loss, int64_t micro_batch_size,
                                   std::vector<TensorMap> batches,
                                   std::function<ForwardMode(int)> mode, bool training,
                                   GradBuckets* buckets, double loss_scale)
    : chunks_(chunks),
      loss_(loss),
      micro_batch_size_(micro_batch_size),
      batches_(std::move(batches)),
      mode_(std::move(mode)),
      training_(training),
      buckets_(buckets),
      loss_scale_(loss_scale),
      ctx_(chunks.size()),
      dloss_(batches_.size()) {
  for (auto& row : ctx_) row.resize(batches_.size());
}

std::vector<TensorSpec> MicroBatchRunner::recv_specs(int chunk) const {
  return chunks_[chunk]->recv_specs(micro_batch_size_);
}

std::vector<TensorSpec> MicroBatchRunner::send_specs(int chunk) const {
  return chunks_[chunk]->send_specs(micro_batch_size_);
}

TensorMap MicroBatchRunner::forward(int microbatch, int chunk, const TensorMap& input) {
  const ModelChunk& model = *chunks_[chunk];
  const TensorMap& batch = batches_[microbatch];
  std::unique_ptr<ModelChunk::Ctx>& ctx = ctx_[chunk][microbatch];
  ctx = model.new_ctx();
  TensorMap out = model.forward(input, batch, *ctx, mode_(microbatch));
  if (model.is_last()) {
    const ObjectiveScale scale{loss_scale_, static_cast<int64_t>(batches_.size()), per_token_};
    const LossTerms terms =
        loss_.forward(out, batch, scale, training_ ? &dloss_[microbatch] : nullptr);
    if (training_ && loss_check_ && !terms.terms().empty()) loss_check_(terms.terms().front().sum);
    if (!microbatch_means_) {
      losses_.add(terms);
    } else {
      for (const LossTerms::Term& t : terms.terms())
        if (t.count > 0) losses_.add(t.name, t.sum / t.count, 1.0);
    }
    out = TensorMap();
  }
  model.aux_losses(*ctx, &losses_);
  if (!training_) ctx.reset();
  return out;
}

TensorMap MicroBatchRunner::backward(int microbatch, int chunk, const TensorMap& doutput) {
  const ModelChunk& model = *chunks_[chunk];
  // Every schedule runs a chunk's backwards in micro-batch order: the last one finishes its
  // gradients.
  ParamsDone done;
  if (fsdp_) {
    done = ParamsDone([this](const std::vector<const Param*>& ps) { fsdp_->after_backward(ps); },
                      [this](const std::vector<const Param*>& ps) { fsdp_->before_backward(ps); });
  } else if (buckets_ && microbatch == static_cast<int>(batches_.size()) - 1) {
    done = [this](const std::vector<const Param*>& ps) {
      for (const Param* p : ps) buckets_->mark_ready(*p);
      buckets_->poll();
    };
  }
  TensorMap dx = model.backward(model.is_last() ? dloss_[microbatch] : doutput,
                                *ctx_[chunk][microbatch], done);
  ctx_[chunk][microbatch].reset();
  if (model.is_last()) dloss_[microbatch] = TensorMap();
  return dx;
}

}  // namespace megatron
