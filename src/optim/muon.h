// Megatron's emerging optimizers, which treat the matrices and the other parameters apart:
// --optimizer muon (below), and --optimizer lion (AdamWConfig rule kLion: emerging_optimizers'
// Lion, ops::lion_step, for the same matrices with Adam's --adam-beta1/2, as Megatron's registry
// entry builds it; AdamW for the rest; the layer-wise distribution and packed state as Muon's).
//
// Muon (--optimizer muon): Megatron core's TensorParallelMuon, the orthogonalised momentum of
// NVIDIA's emerging_optimizers (the version Megatron pins), for every matrix of the model; Adam (or
// Lion: --muon-scalar-optimizer lion, AdamWConfig::muon_scalar_lion) for the rest (Megatron's
// default parameter override: embeddings, the output layer and every
// parameter that is not 2-D, in Megatron's shapes).
//
// One step of a matrix W with gradient g (already times the clipping coefficient), learning rate
// lr and weight decay wd (decoupled; Megatron never passes the l2 form):
//   W  <- W - lr wd W
//   m  <- mu m + (1 - mu) g                    (torch's lerp; m: "momentum_buffer")
//   u  =  m, or with --muon-nesterov  (1 - mu) g + mu m
//   W  <- W - lr s e NS(u)
// NS: Newton-Schulz (newton_schulz below) on the matrix with the smaller dimension as rows,
// normalised first by its Frobenius norm; s: the scale (--muon-scale-mode) of the matrix's
// [out, in] size; e: --muon-extra-scale-factor. No bias correction, no step count.
//
// Which matrix (orthogonalize): a fused linear_qkv's rows are split into the queries, keys and
// values of every query group (Param::qkv_split; --muon-no-split-qkv: whole), each orthogonalised
// apart. Under tensor parallelism (Param::tp_partition_dim; experts over the expert-TP group),
// --muon-tp-mode:
//   blockwise   each rank orthogonalises its own shard, scaled by the shard's size (the default:
//               results depend on the TP size)
//   duplicated  the shards are all-gathered, every rank orthogonalises the whole matrix and keeps
//               its part (the one-process result)
//   distributed each rank iterates on its shard with the Gram matrices X X^T summed over the group
//               (the one-process result in exact arithmetic, less memory and compute per rank)
// Orthogonalisation commutes with permutations of rows and columns, so a shard's stride blocks
// (SwiGLU's [gate_r | up_r], Mamba's sections) give the one-process result in every mode but
// blockwise.
//
// --muon-fp32-matmul-prec medium (the default) runs the iteration as Megatron does under torch's
// "medium" precision: the normalised matrix and every product rounded to bf16, the products
// accumulated in f32 (Megatron's "BF16 I/O kernels"); high keeps f32 (on GPUs Megatron's high is
// TF32); low is refused (torch rejects it).
//
// State: "momentum_buffer" for each Muon matrix, Adam's exp_avg / exp_avg_sq (with their bias
// correction) or Lion's exp_avg for the others, packed: AdamW::exp_avg() holds every held Param's
// first state, exp_avg_sq() only the Adam parameters' second (state_offset).
//
// Layer-wise distribution (Megatron's LayerWiseDistributedOptimizer: --use-distributed-optimizer
// or the deprecated --optimizer dist_muon with Muon): the gradients are all-reduced as without it,
// each parameter is owned whole by one rank of its data-parallel group (experts: their
// expert-data-parallel group), chosen by a greedy balance of the elements in parameter order (the
// same choice on every rank), and only its owner keeps its state and computes its update; then
// every parameter is broadcast from its owner. The same updates as without it, the state and the
// Newton-Schulz work divided over the replicas. TP peers share their data-parallel rank, so the
// owners of a split matrix's shards are one TP group, whose modes' collectives they run
// together.
#pragma once

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/process_group.h"
#include "optim/adamw.h"

namespace megatron {

enum class MuonScaleMode : uint8_t { kSpectral, kUnitRmsNorm, kShapeScaling };
enum class MuonTpMode : uint8_t { kBlockwise, kDuplicated, kDistributed };

struct MuonConfig {
  double momentum = 0.9;                                // --muon-momentum
  bool nesterov = false;                                // --muon-nesterov
  bool split_qkv = true;                                // --muon-no-split-qkv
  MuonScaleMode scale_mode = MuonScaleMode::kSpectral;  // --muon-scale-mode
  bool bf16_iteration = true;                           // --muon-fp32-matmul-prec medium
  std::string coefficient_type = "quintic";             // --muon-coefficient-type
  int64_t num_ns_steps = 5;                             // --muon-num-ns-steps
  MuonTpMode tp_mode = MuonTpMode::kBlockwise;          // --muon-tp-mode
  double extra_scale_factor = 1.0;                      // --muon-extra-scale-factor
};

// Parses the flags' spellings; false for anything else.
bool parse_muon_scale_mode(const std::string& s, MuonScaleMode* out);
bool parse_muon_tp_mode(const std::string& s, MuonTpMode* out);
// The (a, b, c) of each Newton-Schulz step of a coefficient type: simple, quintic, aol (cycled
// when steps outnumber them) or polar_express (its last repeated). Empty for an unknown type.
std::vector<std::array<double, 3>> muon_coefficients(const std::string& type, int64_t steps);
// The update's scale for an [out, in] matrix: spectral sqrt(max(out, in)), unit_rms_norm
// sqrt(out / in), shape_scaling sqrt(max(1, out / in)).
double muon_scale(MuonScaleMode mode, int64_t out, int64_t in);

// Newton-Schulz on x [m, n] (f32, unchanged): X = x / max(|x|_F, 1e-7), then per step
// A = X X^T, B = b A + c A A, X = a X + B X; returns X [m, n] in f32. transpose: iterate on x^T
// (the result transposed back), which the caller picks so that the rows are the smaller side.
// sum_group (Megatron's tp_mode distributed): x is this rank's block of columns of a matrix
// split over the group; the norm and every A are summed over it. bf16: the medium precision
// (see the file comment).
Tensor newton_schulz(const Tensor& x, const std::vector<std::array<double, 3>>& coefficients,
                     bool transpose, bool bf16, ProcessGroup* sum_group = nullptr);

// Whether the Muon rule applies to p: a trained 2-D parameter (in Megatron's shapes,
// Param::megatron_ndim) other than the embeddings and the output layer.
bool is_muon_matrix(const Param& p);

// The layer-wise distribution's groups: the data-parallel group of the dense parameters and the
// one of the experts (the same group when experts are reduced with the dense parameters).
struct LayerWiseGroups {
  ProcessGroup* dense = nullptr;
  ProcessGroup* expert = nullptr;
};

class Muon : public AdamW {
 public:
  // tp / etp: the groups the dense and the expert parameters are split over (their sizes match
  // the Params' tp_size). layer_wise: the groups to distribute the state over; none: every rank
  // keeps and updates everything.
  Muon(ParamSet& params, const AdamWConfig& cfg, const MuonConfig& muon, ProcessGroup& tp,
       ProcessGroup& etp, const LayerWiseGroups& layer_wise = {});

  using AdamW::step;
  void step(const StepRates& rates, double grad_scale = 1.0) override;

  const MuonConfig& muon() const { return muon_; }
  int64_t state_offset(const Param& p, int k) const override;
  bool states_by_owner() const override { return layer_wise_.dense != nullptr; }
  // Whether this rank updates p (always without the layer-wise distribution).
  bool owns(const Param& p) const { return state_offset(p, 0) >= 0; }
  // The orthogonalised update of p from u (p's local shape, f32), scale included: what the step
  // subtracts times lr. Collective over p's TP group in the duplicated and distributed modes.
  Tensor orthogonalize(const Param& p, const Tensor& u);

 private:
  MuonConfig muon_;
  std::vector<std::array<double, 3>> coefficients_;
  ProcessGroup& tp_;
  ProcessGroup& etp_;
  LayerWiseGroups layer_wise_;
  // Per Param (by ParamSet order): its offsets in exp_avg_ and exp_avg_sq_ (-1: none here), and
  // under the layer-wise distribution its owner's rank in its group.
  struct Held {
    int64_t first = -1, second = -1;
    int owner = 0;
  };
  std::unordered_map<const Param*, Held> held_;
  ProcessGroup& owner_group(const Param& p) const {
    return p.expert_parallel ? *layer_wise_.expert : *layer_wise_.dense;
  }
  // One matrix [rows, cols] of p's shard (a whole weight, or a query, key or value block), its
  // full size rows x cols x (TP size along the partition dim).
  Tensor orthogonalize_matrix(const Param& p, const Tensor& x);
};

}  // namespace megatron
