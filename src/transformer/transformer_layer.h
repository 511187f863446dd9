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
// Backward mirrors it: the residual stream's gradient passes straight through and each branch
// adds its input gradient. Under sequence parallelism x, the norms, dropout and residual adds
// work on this rank's s/tp positions; attention and MLP gather and scatter them.
#pragma once

#include <string>

#include "transformer/attention.h"
#include "transformer/mlp.h"
#include "transformer/moe/moe_layer.h"
#include "transformer/norm.h"

namespace megatron {

class TransformerLayer {
 public:
  struct Ctx {
    Norm::Ctx ln1, ln2;
    SelfAttention::Ctx attn;
    MLP::Ctx mlp;
    MoELayer::Ctx moe;
    float dropout = 0;
    uint64_t seed = 0, stream_attn = 0, stream_mlp = 0;
  };

  // layer_number is 0-based and global (it keys the layer's dropout streams).
  TransformerLayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                   const TensorParallelContext& tp);

  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

 private:
  Tensor forward_post_ln(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                         const ForwardMode& mode) const;
  Tensor backward_post_ln(const Tensor& dy, Ctx& ctx) const;

 public:
  Norm input_layernorm;  // post_attention_layernorm with cfg.post_layernorm
  SelfAttention self_attention;
  Norm pre_mlp_layernorm;         // post_mlp_layernorm with cfg.post_layernorm
  std::unique_ptr<MLP> mlp;       // a dense layer's MLP, or
  std::unique_ptr<MoELayer> moe;  // an MoE layer's (cfg.moe.is_moe_layer)

 private:
  const TransformerConfig& cfg_;
  int64_t layer_;
  TensorParallelContext tp_;
};

}  // namespace megatron
