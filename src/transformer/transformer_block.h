// TransformerBlock: a stack of TransformerLayers followed by the final norm (Megatron's
// "decoder"), or, in a pipeline stage, a contiguous run of the model's layers, with the final norm
// only on the last stage. Layers keep their global numbers (names and dropout streams), so a
// layer is the same in every pipeline layout. Layers are held by pointer: they are not movable
// (their Params are referenced by the ParamSet).
//
// Full activation recomputation (--recompute-granularity full) is done here, per block (= per
// pipeline stage or model chunk), as Megatron's TransformerBlock does it. The block's layers are
// cut into segments of consecutive layers:
//   uniform: [0, N), [N, 2N), ... (the last segment may be shorter), every segment recomputed;
//   block:   [0, 1), [1, 2), ..., [N-1, N) recomputed, then one plain segment per other layer.
// A recomputed segment keeps only its input in Ctx; its layers' Ctx are dropped as soon as each
// layer's forward is done. Backward re-runs the segment's forward from that input with the same
// ForwardMode and TokenLayout (so the counter-based dropout masks are the same), which rebuilds
// exactly the Ctx the layers would have kept, then runs their backward. Tensor-parallel
// collectives inside the layers are issued again by the recomputation, in the same order on
// every TP rank, so they still pair up. Selective recomputation (core attention only) lives in
// SelfAttention.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "transformer/transformer_layer.h"

namespace megatron {

// Told, during backward, of parameters whose gradient that backward has finished (the
// data-parallel reducer launches a bucket's all-reduce as soon as all of it is final), and, just
// before a module's backward, of the parameters it is about to read and accumulate gradients
// into (begin: Megatron-FSDP gathers sharded weights there and lends a gradient buffer). Each
// module that reports its parameters finished also announces them with begin() first.
struct ParamsDone {
  using Fn = std::function<void(const std::vector<const Param*>&)>;
  Fn after;   // the gradients of these parameters are final for this backward
  Fn before;  // (optional) this backward is about to use these parameters
  ParamsDone() = default;
  ParamsDone(Fn after_fn, Fn before_fn)
      : after(std::move(after_fn)), before(std::move(before_fn)) {}
  // A plain callback (any callable on the parameters) converts: told of finished ones only.
  template <typename F>
  requires std::is_invocable_v < F, const std::vector<const Param*>
  & > ParamsDone(F after_fn)  // NOLINT(google-explicit-constructor)
      : after(std::move(after_fn)) {}
  explicit operator bool() const { return static_cast<bool>(after) || static_cast<bool>(before); }
  // Frozen weights without gradients (Param::requires_grad) are never passed on: no bucket or
  // FSDP unit holds them.
  void operator()(const std::vector<const Param*>& ps) const {
    if (!after) return;
    const std::vector<const Param*> t = trained(ps);
    if (!t.empty()) after(t);
  }
  void begin(const std::vector<const Param*>& ps) const {
    if (!before) return;
    const std::vector<const Param*> t = trained(ps);
    if (!t.empty()) before(t);
  }
  static std::vector<const Param*> trained(const std::vector<const Param*>& ps) {
    std::vector<const Param*> out;
    out.reserve(ps.size());
    for (const Param* p : ps)
      if (p->requires_grad) out.push_back(p);
    return out;
  }
};

class TransformerBlock {
 public:
  struct Ctx {
    std::vector<TransformerLayer::Ctx> layers;  // empty between forward and backward when the
                                                // layer's segment is recomputed
    std::vector<Tensor> segment_inputs;         // per segment: its input [s, b, h] if recomputed
                                                // (this TP rank's flat 1/tp with
                                                // distribute_saved_activations)
    std::vector<Shape> segment_shapes;          // the inputs' shapes
    TokenLayout layout;                         // kept for the recomputation (only if any)
    ForwardMode mode;                           // as run in forward, for the recomputation
    Norm::Ctx final_norm;
    std::vector<float> fp8_scales;  // FP8 delayed scaling: the scales forward used (recomputation)
  };

  // Layers [first_layer, first_layer + num_layers) of cfg.num_layers; with_final_norm on the
  // stage that ends the decoder. cfg's recompute fields choose the segments (see above).
  // options: T5's decoder layers (cross-attention, dropout streams after the encoder's).
  TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                   const TensorParallelContext& tp, int64_t first_layer, int64_t num_layers,
                   bool with_final_norm, const LayerOptions& options = {});

  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  // `done` (optional) is called after the final norm's and after each layer's backward.
  // side: the layers' bias and memory gradients, summed (needed when the layout had them).
  Tensor backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done = {},
                  SideGrads* side = nullptr) const;
  void collect(std::vector<Param*>& out);

  std::vector<std::unique_ptr<TransformerLayer>> layers;
  Norm final_layernorm;
  // The layers' self-attention, in layer order (hybrid and linear-replacement layers have none).
  std::vector<SelfAttention*> self_attentions() const {
    std::vector<SelfAttention*> out;
    for (const auto& l : layers)
      if (l->self_attention) out.push_back(l->self_attention.get());
    return out;
  }
  bool has_final_norm() const { return has_final_norm_; }

  // Layers [begin, end) (indices into `layers`) run as one unit; `recompute`: only the input
  // is kept and the forward is re-run in backward.
  struct Segment {
    int64_t begin = 0, end = 0;
    bool recompute = false;
  };
  const std::vector<Segment>& segments() const { return segments_; }
  // FP8 (cfg.fp8): the block's region (null without FP8 layers), whose GEMMs' scaling state the
  // chunk checkpoints and whose ends update the trainer's Fp8Registry.
  Fp8Region* fp8_region() const { return fp8_.get(); }

 private:
  // Layer i's parameters (TransformerLayer::collect), as the gate and the backward hooks take them.
  std::vector<const Param*> layer_params(int64_t i) const;
  // The layers' FP8 GEMMs, Megatron's fp8_autocast region around this block (null: no FP8).
  std::unique_ptr<Fp8Region> fp8_;
  ProcessGroup* amax_group_ = nullptr;
  ProcessGroup* tp_group_ = nullptr;  // distributes the kept segment inputs (or null)
  bool has_final_norm_;
  std::vector<const Param*> final_norm_params_;
  std::vector<Segment> segments_;  // covers every layer, in order
};

// The segments of a block of `num_layers` layers under cfg's recompute settings (one
// non-recomputed segment per layer without full recomputation). Checks the settings.
std::vector<TransformerBlock::Segment> recompute_segments(const TransformerConfig& cfg,
                                                          int64_t num_layers);

}  // namespace megatron
