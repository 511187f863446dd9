// The shape every model takes for the trainer: ModelChunk (one virtual pipeline stage of any
// architecture), LossFn (what the last stage's outputs cost), LossTerms (the named results).
//
// This is Megatron's forward_step_func contract (the model's output tensor and a loss_func that
// returns the loss, its token count and the named values to log) cut at pipeline stages: a chunk
// declares what it receives from the previous stage and sends to the next as TensorSpecs, which
// batch fields it reads, and runs forward and backward over named tensors; the last chunk's
// outputs go to the LossFn. Trainer, pipeline executor and checkpointing see only these types,
// never a model class. Not a module system: there is no autograd here, each chunk writes its own
// backward.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/param.h"
#include "tensor/tensor_map.h"
#include "transformer/forward_mode.h"
#include "transformer/transformer_block.h"  // ParamsDone, TopKRouter

namespace megatron {

// Named loss sums, each with the count it is averaged over ("lm loss": the sum of masked token
// losses and the number of masked tokens). The first term is the objective backward follows;
// the others are logged (Megatron's loss_func returns them in its reporting dict). Sums and
// counts add over micro-batches and data-parallel ranks; the value reported is sum / count.
class LossTerms {
 public:
  struct Term {
    std::string name;
    double sum = 0, count = 0;
    double value() const { return sum / std::max(count, 1.0); }
  };
  // Adds (sum, count) to `name`, appending it if new.
  void add(const std::string& name, double sum, double count);
  // Adds every term of `other`.
  void add(const LossTerms& other);
  const std::vector<Term>& terms() const { return terms_; }
  bool empty() const { return terms_.empty(); }
  // The term `name`; it must be there.
  const Term& at(const std::string& name) const;

 private:
  std::vector<Term> terms_;
};

// How the objective of one micro-batch is scaled: its mean loss divided by the number of
// micro-batches (so that a step's gradients are those of the global-batch mean, as Megatron's),
// times the fp16 loss scale. per_token (--calculate-per-token-loss): the sum of its token losses
// times the loss scale instead; the trainer then divides the summed gradients by the global
// batch's token count (Megatron's finalize_model_grads), making the objective the mean over
// every token of the global batch rather than the mean of per-micro-batch means.
struct ObjectiveScale {
  double loss_scale = 1.0;
  int64_t microbatches = 1;
  bool per_token = false;
};

class ModelChunk {
 public:
  // What a forward keeps for its backward: one per (chunk, micro-batch) in flight.
  struct Ctx {
    virtual ~Ctx() = default;
  };

  virtual ~ModelChunk() = default;
  virtual std::unique_ptr<Ctx> new_ctx() const = 0;
  // The tensors received from the previous virtual stage (empty on the first) and sent to the
  // next (empty on the last), for micro-batches of `micro_batch_size` sequences.
  virtual std::vector<TensorSpec> recv_specs(int64_t micro_batch_size) const = 0;
  virtual std::vector<TensorSpec> send_specs(int64_t micro_batch_size) const = 0;
  // The micro-batch fields this chunk reads (a rank whose chunks read none gets no batches).
  virtual std::vector<std::string> batch_fields() const = 0;
  // Whether this is the model's last chunk, whose outputs go to the loss.
  virtual bool is_last() const = 0;
  // in: the previous stage's tensors (recv_specs); batch: the micro-batch. Returns the send_specs
  // tensors, or on the last chunk what its LossFn reads. Keeps what backward needs in ctx.
  virtual TensorMap forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                            const ForwardMode& mode) const = 0;
  // dout: the gradients of forward's outputs. Returns the gradients of `in` (empty on the first
  // chunk) and accumulates parameter gradients; `done` (optional) hears of every parameter as
  // soon as its gradient is final for this backward.
  virtual TensorMap backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const = 0;
  // Inference (generation, evaluation): the forward of s new positions of b sequences, through
  // mode.kv_cache when set (transformer/kv_cache.h), keeping nothing. The first chunk reads
  // batch "tokens" [b, s] i64 (and "position_ids", optional: the cache's offset on); the others
  // receive infer_specs(b, s) in `in`. Returns infer_specs(b, s) for the next chunk, or on the
  // last chunk "logits" [s b, Vp] f32 over the whole padded vocabulary (row t b + i: position t of
  // sequence i; the last position's only, [b, Vp], with last_only). Models that do not generate
  // refuse.
  virtual TensorMap infer(const TensorMap& in, const TensorMap& batch, const ForwardMode& mode,
                          bool last_only) const;
  virtual std::vector<TensorSpec> infer_specs(int64_t b, int64_t s) const;
  // Terms this chunk adds itself after its forward (an MoE router's load-balancing loss, a
  // z-loss); none by default. Called for every chunk; the trainer reduces and reports the terms
  // of the last pipeline stage's ranks, so a model whose earlier stages add terms must sum them
  // over the pipeline group into the last stage's (as Megatron's MoE auxiliary-loss tracker does).
  virtual void aux_losses(const Ctx& /*ctx*/, LossTerms* /*terms*/) const {}
  // Every parameter, in registration order.
  virtual std::vector<Param*> parameters() = 0;
  // The routers of this chunk's MoE layers (none for a dense model), for the trainer's
  // once-per-step expert-bias update.
  virtual std::vector<TopKRouter*> moe_routers() { return {}; }
  // The self-attention of this chunk's decoder layers (Megatron's clip_qk walks decoder.layers:
  // not an encoder's, not the MTP depths'), for --qk-clip and --log-max-attention-logit
  // (train/qk_clip.h); none by default.
  virtual std::vector<SelfAttention*> decoder_self_attentions() { return {}; }
  // The chunk's FP8 regions (Megatron's fp8_autocast contexts), which the trainer joins to one
  // Fp8Registry per rank (Transformer Engine's global amax buffer); none by default.
  virtual std::vector<Fp8Region*> fp8_regions() { return {}; }
  // State that checkpoints save beside the parameters but that no optimizer trains (Megatron's
  // _extra_state: FP8 delayed scaling's scales and amax histories, the regions' in order), each
  // a Param with its own f32 storage in `main`.
  std::vector<Param*> extra_state() {
    std::vector<Param*> out;
    for (const Fp8Region* r : fp8_regions())
      for (Param* p : r->state()) out.push_back(p);
    return out;
  }
};

class LossFn {
 public:
  virtual ~LossFn() = default;
  // The loss terms of one micro-batch from the last chunk's outputs. With `dout` (training), also
  // the gradient of the objective (the first term's sum / count, scaled as `scale` says) with
  // respect to each of those outputs.
  virtual LossTerms forward(const TensorMap& out, const TensorMap& batch,
                            const ObjectiveScale& scale, TensorMap* dout) const = 0;
};

}  // namespace megatron
