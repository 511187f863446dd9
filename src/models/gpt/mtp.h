// MultiTokenPrediction: Megatron's multi-token prediction (DeepSeek-V3's MTP; --mtp-num-layers D,
// --mtp-loss-scaling-factor), on the last pipeline stage after the decoder's final norm.
//
// Depth k = 1..D predicts the token k + 1 places ahead. With h_0 the decoder's output:
//
//   ids_k = ids_{k-1} rolled left by one (the last position 0), ids_0 the input tokens
//   e_k   = embedding(ids_k)                                     (the model's word embeddings)
//   h_k   = final_layernorm_k(layers_k(eh_proj_k([enorm_k(e_k) | hnorm_k(h_{k-1})])))
//   loss_k = cross entropy of output_layer(h_k) against the labels rolled left by k
//
// with the model's own output layer (shared head). eh_proj is column parallel [2h -> h], its
// output gathered over TP (and scattered over the sequence under sequence parallelism), as
// Megatron's MultiTokenPredictionLayer. layers_k is one transformer layer of the last decoder
// layer's kind (MoE if that is) in a GPT model; in a hybrid model the layers of its pattern's MTP
// part (--hybrid-layer-pattern "MAIN/*E/*E": an attention layer, then an MoE layer; Megatron's
// HybridStack inside the MTP layer, without a final norm of its own). They are numbered after the
// decoder's layers, depth k's layer j as num_layers + k L + j for L layers per depth (their
// dropout streams and MoE statistics).
// With packed documents (TokenLayout::packed, --dataloader-inter-document-masking) every roll
// stays inside each document, the document's last position taking 0 (Megatron core 0.19's
// _roll_tensor_packed_seq): no depth predicts across a document boundary.
// forward returns each depth's per-token loss [b, s], unmasked: GPTLoss masks the last k
// positions (of each document when packed: the rolled loss mask) and scales each depth's mean by
// --mtp-loss-scaling-factor / D into the objective (Megatron's MTPLossAutoScaler), logging it as
// "mtp_k loss".
//
// Parameters are Megatron's names: mtp.layers.{k-1}.{enorm, hnorm, eh_proj, transformer_layer.*,
// final_layernorm}, a hybrid model's layers mtp.layers.{k-1}.mtp_model_layer.layers.{j}.*. Under
// --recompute-granularity full (method uniform) each depth from the norms to the final norm is
// recomputed in backward (recomputes()).
//
// FP8 (--fp8-format): as Megatron's MultiTokenPredictionLayer, each depth runs eh_proj inside one
// fp8_autocast region and its transformer layer inside another (two Fp8Regions: with delayed
// scaling each one's end reduces the amaxes over the stage's amax group and updates the scales
// of every GEMM in the trainer's Fp8Registry, forward and backward, as TE's global buffer:
// docs/FP8.md), always in FP8: the global FP8 context, whatever --first-last-layers-bf16 keeps
// out of the decoder. A recomputed depth re-runs with the scales its forward used. The shared
// output layer stays in high precision, as the decoder's.
#pragma once

#include <memory>
#include <vector>

#include "models/common/language_embedding.h"
#include "models/common/lm_head.h"
#include "parallel/context_parallel.h"
#include "parallel/fp8_scaling.h"
#include "parallel/tensor_parallel_linear.h"
#include "transformer/transformer_layer.h"

namespace megatron {

class MultiTokenPrediction {
 public:
  struct Depth {
    Depth(const std::string& name, const TransformerConfig& cfg, int64_t first_layer,
          const TensorParallelContext& tp);
    Norm enorm, hnorm;
    ColumnParallelLinear eh_proj;
    // GPT: one layer (transformer_layer); a hybrid model: its MTP pattern's (mtp_model_layer).
    std::vector<std::unique_ptr<TransformerLayer>> layers;
    Norm final_layernorm;
    // FP8: eh_proj's region and the transformer layer's (null without FP8).
    std::unique_ptr<Fp8Region> proj_fp8, layer_fp8;
  };
  struct Ctx {
    struct Depth {
      LanguageEmbedding::Ctx embedding;
      Norm::Ctx e, h, f;
      ColumnParallelLinear::Ctx proj;
      std::vector<TransformerLayer::Ctx> layers;
      LMHead::Ctx head;
      // Full recomputation: the region's inputs (the embedding output and the previous hidden
      // states); e, h, proj, layers and f are dropped after forward and rebuilt in backward,
      // FP8 GEMMs with the scales the forward used.
      Tensor e_in, prev_in;
      std::vector<float> proj_scales, layer_scales;
    };
    std::vector<Depth> depths;
    bool recompute = false;
    TokenLayout layout;  // what the recomputation runs with
    ForwardMode mode;
    Tensor ends;  // packed documents: document_ends of the layout, for the loss mask's rolls
  };

  MultiTokenPrediction(const TransformerConfig& cfg, const TensorParallelContext& tp);
  MultiTokenPrediction(const MultiTokenPrediction&) = delete;
  MultiTokenPrediction& operator=(const MultiTokenPrediction&) = delete;

  // hidden: the decoder's normed output [s', b, h]; tokens, labels [b, s] i64. Returns per depth
  // the per-token loss [b, s] against the labels rolled left by k (last k positions: label 0).
  std::vector<Tensor> forward(const Tensor& hidden, const Tensor& tokens, const Tensor& labels,
                              const LanguageEmbedding& embedding, const LMHead& head,
                              const TokenLayout& layout, Ctx& ctx, const ForwardMode& mode) const;
  // dlosses: each depth's loss gradient [b, s]. Returns the gradient of hidden; accumulates the
  // depths', the embedding's and the head's parameter gradients.
  Tensor backward(const std::vector<Tensor>& dlosses, const LanguageEmbedding& embedding,
                  const LMHead& head, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  // Param::separate_norm on every parameter of the blocks (--mtp-detach-heads).
  void mark_separate_norm_group();
  // FP8: every depth's two regions, in order (checkpointed and registered through the chunk's
  // fp8_regions()); empty without.
  std::vector<Fp8Region*> fp8_regions() const;
  // Prediction depths (--mtp-num-layers), each an application of its block: its own, or with
  // --mtp-use-repeated-layer the one block (layers holds one).
  int64_t depths() const { return cfg_.mtp_num_layers; }
  const Depth& block(int64_t k) const;
  // Megatron's MTP recomputation: with --recompute-granularity full and --recompute-method
  // uniform, in training, each depth's enorm/hnorm, eh_proj, transformer layer and final norm
  // (its _proj_and_transformer_layer) are recomputed in backward; block skips it, as Megatron.
  bool recomputes() const { return recompute_; }
  // The context-parallel group the rolls cross (GPTChunk rolls the loss mask with it).
  const ContextParallelContext& cp() const { return tp_.cp; }

  std::vector<std::unique_ptr<Depth>> layers;

 private:
  // The recomputed region of depth k, from the embedding output e and the previous depth's
  // hidden states prev, to the final norm's output. recomputing: inside backward, the FP8
  // regions already set to the forward's scales (nothing recorded or updated here).
  Tensor region_forward(const Depth& L, Ctx::Depth& c, const Tensor& e, const Tensor& prev,
                        const TokenLayout& layout, const ForwardMode& mode, bool recomputing) const;

  // Depth k's forward mode: a repeated block's k-th application takes the dropout streams of
  // depth k's own block and 1 / depths of its MoE losses (ForwardMode::moe_aux_share).
  ForwardMode application_mode(const ForwardMode& mode, int64_t k) const;

  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  bool recompute_ = false;
};

// x [b, s] (any dtype) rolled left by one along s, the last column zero (Megatron's roll_tensor
// without context parallelism).
Tensor roll_left(const Tensor& x);
// The same roll of the whole sequence when x is this rank's context-parallel part [b, 2c]
// (global chunks r and 2 cp - 1 - r, cp_local_columns): each chunk shifts left and takes the
// first element of the global chunk after it, gathered over CP (one all-gather of [b, 2]); the
// sequence's last position gets 0. Collective over CP; roll_left without CP.
Tensor roll_left(const Tensor& x, const ContextParallelContext& cp);
// Packed documents: [b, L] i32, 1 at the last position of each document but the sequence's last
// (whose roll gives 0 anyway), for this rank's columns (under CP its [b, 2c] part) of the
// doc_start it takes (the attention's, global positions). Collective over CP.
Tensor document_ends(const Tensor& doc_start, const ContextParallelContext& cp);
// roll_left(x, cp) with 0 at every position `ends` marks (undefined: none): a roll inside each
// document.
Tensor roll_left(const Tensor& x, const ContextParallelContext& cp, const Tensor& ends);

}  // namespace megatron
