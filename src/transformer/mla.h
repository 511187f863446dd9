// MlaProjections: multi-latent attention's query, key and value projections (Megatron's
// MLASelfAttention.get_query_key_value_tensors), producing the packed buffer SelfAttention's core
// attention reads, so that RoPE, the core attention (context parallelism, dropout, selective
// recomputation), the KV cache and linear_proj are the ones of ordinary attention.
//
//   q   = linear_q_up_proj(q_layernorm(linear_q_down_proj(x)))    (or linear_q_proj(x) without
//                                                                  --q-lora-rank)
//   c, k_pe = split(linear_kv_down_proj(x), [kv_lora_rank, qk_pos_emb_head_dim])
//   k_nope, v = split(linear_kv_up_proj(kv_layernorm(c)), per head [qk_head_dim, v_head_dim])
//
// q is per head [q_nope (qk_head_dim) | q_pe (qk_pos_emb_head_dim)] and k_pe one rotary key
// shared by every head. The packed buffer is [s, b, np/tp, 3, W] (W = cfg.head_dim(), the wider of
// a query and a value head), per head
//
//   query [q_pe | q_nope | 0],  key [k_pe | k_nope | 0],  value [v | 0]
//
// the rotary channels first so that RoPE turns the first qk_pos_emb_head_dim channels of the
// query and key heads. Reordering the channels of q and k alike changes no q . k, and zero
// padding adds nothing to them nor to the heads' outputs, whose first v_head_dim channels are
// what linear_proj takes. (Megatron and Hugging Face also turn the rotary channels as pairs
// (2j, 2j + 1) after de-interleaving them: the same q . k as turning them in place, which
// SelfAttention does with --rotary-interleaved's pairing.)
//
// The down projections are replicated over tensor parallelism (Megatron's TELinear "duplicated"),
// the up projections column parallel. Under sequence parallelism x is [s/tp, b, h]: the latents
// stay sequence-parallel into the up projections (which gather them) and k_pe is all-gathered,
// its gradient reduce-scattered; the down projections' and latent norms' weight gradients are
// then partial sums over TP (Param::sequence_parallel, as Megatron marks them). Without sequence
// parallelism every TP rank holds the whole k_pe and its heads' share of its gradient, summed
// over TP in backward (as we read Megatron's code it has no such sum with TP > 1 and no sequence
// parallelism; here every layout matches one process).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/linear.h"
#include "parallel/tensor_parallel_linear.h"
#include "transformer/config.h"
#include "transformer/norm.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class MlaProjections {
 public:
  struct Ctx {
    Linear::Ctx q_down, kv_down;
    Norm::Ctx q_norm, kv_norm;
    ColumnParallelLinear::Ctx q_up, kv_up;  // q_up: linear_q_proj's without --q-lora-rank
    int64_t s = 0, b = 0;                   // the whole sequence's length, the batch
    // What the up projections start from: the query latent (x itself without --q-lora-rank) and
    // the key/value latent [s', b, r] before their norms, the rotary key [s b, pe] (gathered
    // under sequence parallelism).
    Tensor q_latent, kv_latent, k_pe;
  };

  MlaProjections(const std::string& name, const TransformerConfig& cfg,
                 const TensorParallelContext& tp);

  // x [s, b, h] (or [s/tp, b, h] under sequence parallelism; f32, or gemm_input_dtype()) ->
  // the packed [s, b, np/tp, 3, W] buffer, before RoPE.
  Tensor forward(const Tensor& x, Ctx& ctx) const;
  // The packed buffer's gradient (after RoPE's backward) -> dx shaped like forward's x. Adds to
  // every weight's gradient.
  Tensor backward(const Tensor& dqkv, Ctx& ctx) const;
  // --recompute-modules mla_up_proj (output-discarding): drop what the latent norms and up
  // projections kept, and later rebuild the packed buffer (before RoPE) from the latents, with
  // the same kernels on the same values (the same bits), refilling what backward needs.
  void drop_up(Ctx& ctx) const;
  Tensor up(Ctx& ctx) const;
  // --recompute-modules layernorm: forget x where forward kept it, and take it back.
  void drop_input(Ctx& ctx) const;
  void keep_input(const Tensor& x, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  std::vector<Fp8GemmScaling*> enable_fp8(const Fp8Config& cfg);
  // What the down projections (or linear_q_proj) take x in: a norm before them may write it.
  DType gemm_input_dtype() const { return linear_kv_down_proj.gemm_input_dtype(); }

  std::optional<Linear> linear_q_down_proj;              // with --q-lora-rank
  std::optional<Norm> q_layernorm;                       // with --q-lora-rank and --qk-layernorm
  std::optional<ColumnParallelLinear> linear_q_up_proj;  // with --q-lora-rank
  std::optional<ColumnParallelLinear> linear_q_proj;     // without
  Linear linear_kv_down_proj;
  std::optional<Norm> kv_layernorm;  // --qk-layernorm
  ColumnParallelLinear linear_kv_up_proj;

 private:
  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  int64_t heads_local_;
};

}  // namespace megatron
