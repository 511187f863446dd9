// TransformerLayer: Megatron's pre-norm GPT layer.
//
//   x1  = x + dropout(self_attention(input_layernorm(x)))
//   out = x1 + dropout(mlp(pre_mlp_layernorm(x1)))
//
// The MLP is a Mixture of Experts (MoELayer) on the layers cfg.moe says (--moe-layer-freq).
//
// With cfg.post_layernorm (--transformer-block-type post_ln: original BERT, Hugging Face's
// BertModel) the norms follow the residual adds instead:
//
//   x1  = post_attention_layernorm(x + dropout(self_attention(x)))
//   out = post_mlp_layernorm(x1 + dropout(mlp(x1)))
//
// held in the same two members (input_layernorm, pre_mlp_layernorm) under those names.
//
// T5's decoder layers (LayerOptions::cross_attention) attend to the encoder's output between
// the two (Megatron's pre_cross_attn_layernorm, cross_attention, cross_attn_bda):
//
//   x2  = x1 + dropout(cross_attention(pre_cross_attn_layernorm(x1), memory))
//
// with memory and its padding from the TokenLayout; backward adds the memory's gradient (and the
// self-attention bias's, with T5's relative positions) to SideGrads.
//
// A hybrid model's layers (cfg.mamba.layers, transformer/mamba/mamba_config.h) have one branch
// each: '*' the attention branch only, '-' the MLP branch only (Megatron's MLPLayer), 'E' the
// MLP branch only with the MoE layer as its MLP (Megatron's MoE TransformerLayer of the hybrid
// stack), 'M' a Mamba branch instead of both (Megatron's MambaLayer):
//
//   out = x + dropout(mixer(norm(x)))
//
// A heterogeneous model's layers (cfg.heterogeneous, transformer/heterogeneous_config.h) take
// their own query groups and MLP width (TransformerConfig::for_layer, kept by the layer), and
// either branch may be a no-op (no norm, nothing added) or one linear layer after its norm:
//
//   x1  = x + dropout(linear_attention(input_layernorm(x)))
//   out = x1 + dropout(linear_mlp(pre_mlp_layernorm(x1)))
//
// Backward mirrors it: the residual stream's gradient passes straight through and each branch
// adds its input gradient. Under sequence parallelism x, the norms, dropout and residual adds
// work on this rank's s/tp positions; attention and MLP gather and scatter them.
#pragma once

#include <string>

#include "transformer/attention.h"
#include "transformer/cross_attention.h"
#include "transformer/linear_replacement.h"
#include "transformer/mamba/mamba_mixer.h"
#include "transformer/mlp.h"
#include "transformer/moe/moe_layer.h"
#include "transformer/norm.h"

namespace megatron {

// How a block's layers differ from GPT's: T5's decoder layers have cross-attention, and an
// encoder-decoder model numbers the decoder's dropout streams after the encoder's layers.
struct LayerOptions {
  bool cross_attention = false;
  int64_t stream_offset = 0;  // added to the layer number for dropout streams
};

// Gradients a backward gives besides its input's, each added to what is there (set if
// undefined): the self-attention score bias's [1, np/tp, s, s] (f32) and the cross-attention
// memory's [sk', b, h].
struct SideGrads {
  Tensor bias;
  Tensor memory;
};

class TransformerLayer {
 public:
  struct Ctx {
    Norm::Ctx ln1, ln2, ln_cross, ln_mamba;
    MambaMixer::Ctx mamba;
    SelfAttention::Ctx attn;
    CrossAttention::Ctx cross;
    MLP::Ctx mlp;
    MoELayer::Ctx moe;
    LinearReplacement::Ctx linear_attention, linear_mlp;
    // --recompute-modules moe: the MoE layer's input and mode, kept instead of its Ctx.
    Tensor moe_input;
    ForwardMode moe_mode;
    // --recompute-modules layernorm: the norms' outputs were dropped from their consumers' Ctx.
    bool ln1_dropped = false, ln2_dropped = false;
    float dropout = 0;
    uint64_t seed = 0, stream_attn = 0, stream_mlp = 0, stream_cross = 0;
  };

  // layer_number is 0-based and global (it keys the layer's dropout streams, after
  // options.stream_offset, and picks a heterogeneous model's block).
  TransformerLayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                   const TensorParallelContext& tp, const LayerOptions& options = {});

  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  // side: where the bias and memory gradients go (needed when the layout had them).
  Tensor backward(const Tensor& dy, Ctx& ctx, SideGrads* side = nullptr) const;
  void collect(std::vector<Param*>& out);
  int64_t layer_number() const { return layer_; }
  // Runs every GEMM of the layer's attention and MLP (or experts) in FP8 (cfg.fp8); returns
  // their scaling state.
  std::vector<Fp8GemmScaling*> enable_fp8();

 private:
  Tensor forward_post_ln(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                         const ForwardMode& mode) const;
  Tensor backward_post_ln(const Tensor& dy, Ctx& ctx, SideGrads* side) const;
  // The MLP or MoE branch, with --recompute-modules moe's recomputation of the MoE layer (the
  // dense MLP recomputes itself: MLP::set_recompute).
  Tensor ffn_forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const;
  Tensor ffn_backward(const Tensor& dy, Ctx& ctx) const;
  // The dtype the pre-MLP norm writes: its consumer's GEMM input (f32 for an MoE router).
  DType mlp_input_dtype(const Tensor& x) const;
  Tensor forward_mamba(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                       const ForwardMode& mode) const;
  Tensor backward_mamba(const Tensor& dy, Ctx& ctx) const;

 public:
  // The attention branch (null in a hybrid model's '-' and 'M' layers and a heterogeneous
  // model's no-op attention).
  std::unique_ptr<Norm> input_layernorm;  // post_attention_layernorm with cfg.post_layernorm
  std::unique_ptr<SelfAttention> self_attention;        // whole attention, or
  std::unique_ptr<LinearReplacement> linear_attention;  // its linear replacement
  std::unique_ptr<Norm> pre_cross_attn_layernorm;       // decoder layers of T5
  std::unique_ptr<CrossAttention> cross_attention;
  // The MLP branch (null in a hybrid model's '*' and 'M' layers and a heterogeneous model's
  // no-op MLP).
  std::unique_ptr<Norm> pre_mlp_layernorm;        // post_mlp_layernorm with cfg.post_layernorm
  std::unique_ptr<MLP> mlp;                       // a dense layer's MLP, or
  std::unique_ptr<MoELayer> moe;                  // an MoE layer's (cfg.moe.is_moe_layer), or
  std::unique_ptr<LinearReplacement> linear_mlp;  // a heterogeneous layer's linear MLP
  // A hybrid model's 'M' layers: Megatron's MambaLayer norm and mixer.
  std::unique_ptr<Norm> norm;
  std::unique_ptr<MambaMixer> mixer;
  bool has_mlp() const { return mlp || moe || linear_mlp; }
  bool has_attention() const { return self_attention || linear_attention; }
  // The layer's own config (a heterogeneous layer's sizes; else the model's).
  const TransformerConfig& config() const { return cfg_; }

 private:
  std::unique_ptr<const TransformerConfig> own_cfg_;  // a heterogeneous layer's; else null
  const TransformerConfig& cfg_;                      // *own_cfg_, or the model's
  int64_t layer_, stream_layer_;
  TensorParallelContext tp_;
};

// acc += g (acc = g if undefined; f32 when g is half, so sums over layers keep their precision).
void accumulate_side_grad(Tensor& acc, const Tensor& g);

}  // namespace megatron
