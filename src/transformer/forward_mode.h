// ForwardMode: what a forward pass needs beyond its input: training or not (dropout on/off) and
// the counter-based RNG coordinates of this micro-batch. Each dropout site derives its own stream
// from `stream` and a site id, so masks differ across layers and micro-batches yet are exactly
// reproducible (same seed and step -> same masks, in any parallel layout).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "parallel/param.h"
#include "parallel/param_gate.h"
#include "tensor/tensor.h"

namespace megatron {

class KvCache;
class MoeAuxTracker;

// Where each token sits and what it sees: positions [s, b] i64 (RoPE; undefined = 0..s-1);
// with --reset-attention-mask, doc_start [b, s] i32 (first position of each token's document, so
// attention stays inside documents; undefined = one document per sequence); causal (decoders)
// or bidirectional (encoders: BERT); key_valid [b, s] i32, nonzero for real tokens, so that no
// query attends to padding (BERT's padding mask; undefined = every token is real).
struct TokenLayout {
  Tensor positions;
  Tensor doc_start;
  // doc_start's documents are packed sequences (--dataloader-inter-document-masking, Megatron's
  // THD batches): besides attention, the Mamba layers restart their state at each document and
  // multi-token prediction rolls its tokens within each. False: an attention mask only
  // (--reset-attention-mask).
  bool packed = false;
  // packed: the whole sequence's document starts [b, S] in sequence order (under context
  // parallelism gathered once per forward, for the Mamba layers' whole-sequence kernels).
  Tensor whole_doc_start;
  bool causal = true;
  Tensor key_valid;
  // Additive bias on every self-attention's scaled scores, [1, np/tp, s, s] (T5's relative
  // positions, this rank's heads), or undefined.
  Tensor bias;
  // Cross-attention (T5's decoder layers): the encoder's output [sk', b, h] and which of its
  // positions are real, [b, sk] i32 (undefined: all); memory undefined: no cross-attention.
  Tensor memory;
  Tensor memory_valid;
};

struct ForwardMode {
  bool training = false;
  uint64_t seed = 0;
  uint64_t stream = 0;  // unique per (iteration, micro-batch)
  // Asked before each module reads its weights (--overlap-param-gather); null: always current.
  const ParamGate* gate = nullptr;
  // The first micro-batch of a training step (Megatron's is_first_microbatch): FP8 layers
  // quantise their weights on it and reuse that copy for the step's other micro-batches.
  bool first_micro_batch = true;
  // MoE load-balancing losses (training): the weight their gradients join the objective with
  // (the main loss's 1 / micro-batches x loss scale), and with --calculate-per-token-loss
  // (aux_per_token) they are first multiplied by the micro-batch's tokens, since the gradients
  // are later divided by the global token count. tracker: where each layer's values go (null:
  // not recorded).
  double aux_loss_scale = 0.0;
  bool aux_per_token = false;
  MoeAuxTracker* moe_tracker = nullptr;
  // A repeated MTP block's application (--mtp-use-repeated-layer): its MoE losses count
  // moe_aux_share = 1 / depths of theirs (Megatron's division by mtp_num_layers: the
  // load-balancing losses' gradient and logged value, the z-loss's logged value), and its
  // dropout streams are those of layer number + stream_layer_offset
  // (the streams the depth's own block would have).
  double moe_aux_share = 1.0;
  int64_t stream_layer_offset = 0;
  // Generation: the new positions' keys and values join this cache and attention reads every
  // cached position (transformer/kv_cache.h); null: attention over the input's positions only.
  KvCache* kv_cache = nullptr;

  // (Frozen weights without gradients, Param::requires_grad, are whole and current on every
  // rank: the gate never hears of them.)
  void need(const std::vector<const Param*>& params) const {
    if (!gate || params.empty()) return;
    const std::vector<const Param*> t = gated(params);
    if (!t.empty()) gate->wait_for(t);
  }
  // After the forward that called need(params) has read them.
  void release(const std::vector<const Param*>& params) const {
    if (!gate || params.empty()) return;
    const std::vector<const Param*> t = gated(params);
    if (!t.empty()) gate->release(t);
  }
  static std::vector<const Param*> gated(const std::vector<const Param*>& params) {
    std::vector<const Param*> out;
    out.reserve(params.size());
    for (const Param* p : params)
      if (p->requires_grad) out.push_back(p);
    return out;
  }

  // need(params) now and release(params) at the end of the scope (a forward with several exits).
  class Use {
   public:
    Use(const ForwardMode& mode, std::vector<const Param*> params)
        : mode_(mode), params_(std::move(params)) {
      mode_.need(params_);
    }
    ~Use() { mode_.release(params_); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    const ForwardMode& mode_;
    std::vector<const Param*> params_;
  };

  // Stream for dropout site `site` of layer `layer` (site < 8).
  uint64_t site_stream(int64_t layer, int site) const {
    return stream * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(layer + stream_layer_offset) * 8 +
           static_cast<uint64_t>(site);
  }
};

}  // namespace megatron
