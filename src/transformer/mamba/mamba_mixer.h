// MambaMixer: Megatron's Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py), the sequence mixing of
// a hybrid model's 'M' layers:
//
//   [z | x | B | C | dt] = in_proj(h)                     (column parallel)
//   [x | B | C] = silu(causal depthwise conv1d([x | B | C]))
//   y = SSD scan(x, dt, A = -exp(A_log), B, C, D, dt_bias)  (ssm_kernels.h)
//   out = out_proj(rmsnorm_per_group(y * silu(z)) * norm.weight)  (row parallel)
//
// Tensor parallelism: each rank holds whole heads and groups, its slices of z, x, B, C and dt (the
// in-projection's five blocks are each split over the ranks, Param::tp_partition_sections), of
// the convolution's channels, of A_log, D, dt_bias and the norm weight; only the projections
// communicate, as a column/row pair (all-gather and reduce-scatter under sequence parallelism).
// Parameters keep Megatron's names and layouts, except conv1d.weight, stored [channels, d_conv]
// (Megatron's nn.Conv1d holds [channels, 1, d_conv]). Initialisation follows MambaStack's
// _init_weights: in_proj N(0, std), conv1d weight and bias U(+-1/sqrt(d_conv)), out_proj
// N(0, std / sqrt(num_layers)), A_log log U(1, 16), dt_bias softplus^-1 of a log-uniform dt, D and
// the norm ones.
//
// The kernels run in f32 (f64 in f64 runs) on the CPU; in bf16 runs only the projections' GEMMs
// take bf16, as Megatron's mixer computes the scan in fp32.
//
// Context parallelism (Megatron's MambaContextParallel): the in-projection's x, B, C and dt go
// through an all-to-all from this rank's rows of every head to the whole sequence of its share of
// the heads (cp_rows_to_groups; groups repeated when fewer than the CP ranks), the convolution
// and scan run there with the matching slices of the parameters, and y returns by the inverse;
// z stays local for the gated norm (its groups are whole heads).
//
// Generation (mode.kv_cache): the convolution's last d_conv - 1 inputs and the scan's state per
// sequence are carried between calls (KvCache::recurrent), so decoding one position costs the
// same at any length (Megatron's MambaMixer.step).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor_parallel_linear.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/mamba/ssm_kernels.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class MambaMixer {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx in_ctx;
    RowParallelLinear::Ctx out_ctx;
    // In the kernels' dtype: the convolution's input and output, the raw dt and the scan's kept
    // states (this CP rank's heads over the whole sequence), z, the scan's output and the norm's
    // statistics (every head of this rank's rows).
    Tensor xbc, xbc_act, dt, z, y, rstd, kept;
    Tensor doc_start;      // packed documents: [b, whole sequence] i32 in sequence order
    int64_t s = 0, b = 0;  // this rank's rows and sequences
  };

  // layer_number: 0-based and global (the generation state's key).
  MambaMixer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
             const TensorParallelContext& tp);

  // h [s, b, hidden] (or [s/tp, b, hidden] under sequence parallelism) -> the same shape.
  // doc_start: packed documents, the whole sequence's document starts [b, S] in sequence order
  // (TokenLayout::whole_doc_start; S = this rank's rows x CP size); the convolution and the scan
  // then restart at each document (Megatron's seq_idx). Undefined: one document per sequence.
  Tensor forward(const Tensor& h, const Tensor& doc_start, Ctx& ctx, const ForwardMode& mode) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);
  std::vector<Fp8GemmScaling*> enable_fp8(const Fp8Config& cfg);
  DType gemm_input_dtype() const { return in_proj.gemm_input_dtype(); }

  ColumnParallelLinear in_proj;
  Param conv1d_weight, conv1d_bias, A_log, D, dt_bias, norm_weight;
  RowParallelLinear out_proj;

 private:
  // This CP rank's heads and groups of the TP rank's (all of them without CP): counts, first
  // ones, and how many CP ranks share a group (Megatron's group_repeat_count).
  struct Part {
    int64_t heads, groups, h0, g0, repeat;
  };
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  Part part() const;
  // The convolution's rows of a part: its x channels, its B and its C groups.
  Ranges conv_rows(const Part& p) const;
  // The kernels' shapes for a part over s positions of b sequences, with the document starts
  // [b, s] (undefined: none).
  std::pair<ssm::ConvShape, ssm::ScanShape> kernel_shapes(const Part& p, int64_t s, int64_t b,
                                                          const Tensor& starts) const;
  // CP: [x | B | C] and dt of this rank's rows [L b, .] -> the part's heads over every row.
  Tensor to_heads(const Tensor& xbc, const Tensor& dt, int64_t L, int64_t b, Tensor& dt_out) const;

  int64_t layer_;
  ContextParallelContext cp_;
  int64_t heads_, groups_, head_dim_, state_, d_inner_, conv_dim_, d_conv_;  // this rank's
};

}  // namespace megatron
