// ColumnParallelLinear and RowParallelLinear: Megatron's two halves of a tensor-parallel GEMM.
//
// Both compute Y = X A^T + b with A stored [out, in] like Linear (and torch.nn.Linear). Writing
// the math as Megatron does, with W = A^T so that Y = X W:
//
//   Column parallel: W = [W_1, ..., W_p] split along its columns (A's output rows): rank i holds
//   A_i [out/p, in] and b_i [out/p] and computes Y_i = X W_i + b_i, this rank's slice of Y's last
//   dim. The input enters through copy_to_tp_region ("f": forward identity, backward all-reduce
//   of dX, since every rank's dX_i = dY_i A_i is a partial sum); under sequence parallelism X
//   arrives as [s/p, b, in] and is all-gathered on dim 0 instead (backward: reduce-scatter of dX
//   on dim 0). gather_output all-gathers Y's last dim so the output is whole on every rank.
//
//                 | W_1 |
//   Row parallel: | ... | split along its rows (A's input columns): rank i holds A_i [out, in/p]
//                 | W_p |
//   and X_i = X's columns [i*in/p, (i+1)*in/p), computing the partial product X_i W_i; Y is their
//   sum, made by reduce_from_tp_region ("g": all-reduce forward, identity backward) or, under
//   sequence parallelism, by a reduce-scatter on dim 0 (backward: all-gather of dY). b is not
//   split: it is added once, after the reduction, on every rank.
//
// Under sequence parallelism the replicated bias of RowParallelLinear sees only this rank's
// s/p tokens, so its gradient must be summed over the TP group before the optimizer step
// (Megatron's finalize_model_grads); its Param::sequence_parallel says so.
//
// Initialisation is TP-invariant: the layers mark their shards (Param::tp_partition_dim and
// friends), and ParamSet::initialize fills each shard with the slice of the full tensor that the
// unsharded Param of the same name would get, so every TP size starts from the same weights.
// Param names are the unsharded ones.
//
// Inputs are [..., in] (usually [s, b, h]) and leading dims are flattened into rows for the GEMM.
// ColumnParallelLinear outputs [s, b, out/p] (all s tokens, also under sequence parallelism);
// RowParallelLinear outputs [s, b, out], or [s/p, b, out] under sequence parallelism. Under
// sequence parallelism the column layer keeps the gathered input for backward; Megatron gathers
// it again in backward instead, trading a collective for s*b*in floats of memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/linear.h"
#include "parallel/param.h"

namespace megatron {

class ColumnParallelLinear {
 public:
  struct Options {
    bool with_bias = true;
    bool gather_output = false;      // all-gather Y's last dim (output whole on every rank)
    bool sequence_parallel = false;  // input [s/p, ...], all-gathered on dim 0
    // The output features are `stride` equal blocks, each split over the ranks (2 for SwiGLU's
    // [gate | up], so that each rank's output is [gate_r | up_r]).
    int stride = 1;
    // Or unequal blocks: the full sizes of consecutive output blocks, each split over the ranks
    // (Mamba's in-projection [z | x | B | C | dt]; Param::tp_partition_sections).
    std::vector<int64_t> sections = {};
    // Megatron's skip_bias_add: the output comes without the bias, whose addition (and gradient)
    // the caller fuses into what follows (Linear::set_skip_bias_add).
    bool skip_bias_add = false;
  };
  struct Ctx {
    Linear::Ctx linear;  // the full (gathered) input as the local GEMM saw it
    Shape in_shape;      // the input's shape on this rank
  };

  // `tp` must outlive the layer. in, out: the full (unsharded) sizes.
  ColumnParallelLinear(const std::string& name, int64_t in, int64_t out, double init_std,
                       ProcessGroup& tp, Options options);

  // x [..., in] (or [s/p, ..., in] under sequence parallelism) -> [..., out/p], or [..., out]
  // with gather_output.
  Tensor forward(const Tensor& x, Ctx& ctx) const;
  // dy shaped like forward's output -> dx shaped like its input. Accumulates this rank's weight
  // and bias gradients.
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  // What forward keeps of input x, again (gathered under sequence parallelism: the same
  // collective on every TP rank), for output-discarding recomputation.
  void keep_input(const Tensor& x, Ctx& ctx) const;

  void collect(std::vector<Param*>& out) { local_.collect(out); }
  // The local GEMMs in FP8 (Linear::enable_fp8); the scaling state is replicated over TP.
  Fp8GemmScaling* enable_fp8(const Fp8Config& cfg) {
    return local_.enable_fp8(cfg, tp_.rank(), tp_.size());
  }

  Param& weight() { return local_.weight; }  // [out/p, in]
  Param& bias() { return local_.bias; }      // [out/p]; empty name when there is no bias
  const Param& bias() const { return local_.bias; }
  DType gemm_input_dtype() const { return local_.gemm_input_dtype(); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int64_t out_per_partition() const { return out_local_; }

 private:
  ProcessGroup& tp_;
  Options options_;
  int64_t in_, out_, out_local_;
  Linear local_;
};

class RowParallelLinear {
 public:
  struct Options {
    bool with_bias = true;
    bool input_is_parallel = true;   // x already split on its last dim (a column layer's output)
    bool sequence_parallel = false;  // output reduce-scattered on dim 0; needs input_is_parallel
  };
  struct Ctx {
    Linear::Ctx linear;
    Shape in_shape;
  };

  RowParallelLinear(const std::string& name, int64_t in, int64_t out, double init_std,
                    ProcessGroup& tp, Options options);

  // x [..., in/p] (input_is_parallel) or [..., in] -> [..., out] (or [s/p, ..., out] under
  // sequence parallelism).
  Tensor forward(const Tensor& x, Ctx& ctx) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  Fp8GemmScaling* enable_fp8(const Fp8Config& cfg) {
    return local_.enable_fp8(cfg, tp_.rank(), tp_.size());
  }

  Param& weight() { return local_.weight; }  // [out, in/p]
  Param bias;                                // [out], replicated; empty name when there is none
  bool has_bias() const { return !bias.name.empty(); }
  int64_t in_per_partition() const { return in_local_; }
  DType gemm_input_dtype() const { return local_.gemm_input_dtype(); }

 private:
  ProcessGroup& tp_;
  Options options_;
  int64_t in_, out_, in_local_;
  Linear local_;  // the partial GEMM, without bias (added after the reduction)
};

}  // namespace megatron
