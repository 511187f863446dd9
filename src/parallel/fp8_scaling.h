// FP8 scaling: how the operands of a Linear's GEMMs are quantised, as Transformer Engine's
// recipes do it (Megatron's --fp8-format / --fp8-recipe), and the state that carries across steps.
//
// An operand x is quantised with a per-tensor scale s as q = fp8(x s) (core/fp8.h: nearest value,
// saturating); a GEMM of two quantised operands is (q_a q_b) s_a^-1 s_b^-1, the products of FP8
// values summed in f32 and the inverse scales applied to the result (cuBLASLt's FP8 GEMM with
// A/B scale pointers). Every Linear has three quantised operands: its input and its weight
// (forward format, E4M3) and its output gradient (backward format: E5M2 in hybrid, else E4M3).
// fprop: input x weight; dgrad: output gradient x weight; wgrad: output gradient x input (in
// high precision with --no-fp8-wgrad). Biases, norms, attention, the embedding and the output
// layer stay in bf16/f32, as under TE.
//
// Recipes:
//   tensorwise (TE's Float8CurrentScaling): s = fp8_max / amax(x) of the tensor being quantised;
//     amax 0, inf or NaN gives s = 1, an infinite quotient the largest finite value of x's dtype.
//     Under sequence parallelism TE all-reduces (MAX) the amax of the gathered operands (the
//     column-parallel input, the row-parallel output gradient) over the TP group; here those are
//     quantised after the gather, whose amax is that maximum.
//   delayed (TE's DelayedScaling): s comes from amaxes recorded earlier. Each quantisation records
//     amax(x) into row 0 of the operand's history (the max if it is quantised twice). At the end
//     of a region (a TransformerBlock's forward; its backward) the recorded amaxes of all its
//     GEMMs are all-reduced (MAX) over the amax reduction group (TP x DP x CP, Megatron's) and
//     every operand's state is updated as TE's amax_and_scale_update does:
//       history: roll up by one (new[i] = old[i + 1], new[len - 1] = old[0]), then row 0 = 0;
//       amax = old[0] (most_recent) or the max over the old column (max);
//       s = (fp8_max 2^-margin) / amax if amax is finite and > 0, else the previous s; an infinite
//       s becomes FLT_MAX.
//     Initial state: s = 1, history 0. The state (scale [3], amax_history [len, 3] per Linear,
//     columns input, weight, output gradient) is saved in checkpoints (identical on every rank of
//     the group after each update, so replicated) and resumed exactly.
//   mxfp8 (TE's MXFP8BlockScaling) and blockwise (TE's Float8BlockScaling): a scale per block of
//     elements along the GEMM's reduction dimension (core/fp8.h fp8_block_scale), from the
//     block's own amax: no state. An operand read by two GEMMs along different dimensions is
//     quantised twice from its high-precision values (TE's rowwise and columnwise usages): the
//     forward's input and weight rowwise (blocks along the input features), the input gradient's
//     output gradient rowwise and weight columnwise (blocks along the output features), the
//     weight gradient's output gradient and input columnwise (blocks along the tokens). mxfp8:
//     1 x 32 blocks rowwise, 32 x 1 columnwise; blockwise: 1 x 128 and 128 x 1 for inputs and
//     gradients, 128 x 128 for weights (one quantisation serves both usages). Blocks at a
//     tensor's edge are partial, their amax over the elements present (TE's kernels zero-fill),
//     which is also what zero padding to the block size gives. The GEMM multiplies the values
//     times their block's decoding factor (a power of two: exact in bf16), so the quantised
//     tensors hold those and their scale_inv is 1: the products and f32 sums of a block-scaled
//     FP8 GEMM (cuBLASLt's VEC32_UE8M0 / DeepGEMM-style kernels), up to summation order.
//
// Megatron passes is_first_microbatch to TE's layers: the weight is quantised once per step, on
// the first micro-batch, and that copy (with its scale) serves the other micro-batches and the
// backward; its amax is recorded once per step. Activation recomputation re-runs a forward with
// the scales of the original forward (TE saves them per micro-batch) and records nothing, so a
// recomputed run computes what a stored one does. Evaluation (not training) quantises with the
// current scales and records nothing: evaluating never changes the training run.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "parallel/fp8_config.h"
#include "parallel/param.h"

namespace megatron {

// TE's amax_and_scale_update for one operand: history is column `history[i * stride]`, i < len.
void delayed_scaling_update(float* history, int64_t len, int64_t stride, float* scale,
                            float fp8_max, int margin, bool amax_compute_max);
// TE's current-scaling scale for an amax (value_for_inf: the largest finite value of the
// quantised tensor's dtype).
float current_scaling_scale(double amax, float fp8_max, float value_for_inf);

// A quantised operand: q holds FP8 values (bf16 storage, f64 for f64 runs); x ~ q * scale_inv.
// Block-scaled recipes: q holds each FP8 value times its block's decoding factor, scale_inv 1.
struct Fp8Tensor {
  Tensor q;
  float scale_inv = 1.0f;
};

// The FP8 state of one Linear (see the file comment).
class Fp8GemmScaling {
 public:
  enum Operand : int { kInput = 0, kWeight = 1, kGradOutput = 2 };
  static constexpr int kOperands = 3;

  // linear_name: the Linear's name (its weight's without ".weight"); tp_rank/tp_size: its TP
  // group's, so that the replicated state is written once per checkpoint.
  Fp8GemmScaling(const std::string& linear_name, const Fp8Config& cfg, int tp_rank, int tp_size);
  Fp8GemmScaling(const Fp8GemmScaling&) = delete;
  Fp8GemmScaling& operator=(const Fp8GemmScaling&) = delete;

  const Fp8Config& config() const { return cfg_; }
  // x quantised as operand `op` (input or output gradient) for `usage`, recording its amax where
  // the recipe and phase say so.
  Fp8Tensor quantize(const Tensor& x, Operand op, Fp8Usage usage = Fp8Usage::kRowwise);
  // The same into `out` (bf16, or f64 for f64 x; x's size: a view into a larger tensor, such as
  // one expert's rows of a grouped GEMM's input); returns the inverse scale.
  float quantize_into(Tensor& out, const Tensor& x, Operand op,
                      Fp8Usage usage = Fp8Usage::kRowwise);
  // Whether the rowwise and columnwise quantisations of an operand differ (block-scaled recipes);
  // when not, one serves both.
  bool usages_differ() const { return cfg_.block_scaled(); }
  // Whether a backward will read what this forward quantises (a training forward or a
  // recomputation; not evaluation or generation).
  bool backward_follows() const { return recording_ || recomputing_; }
  // The weight for this forward: quantised afresh on a step's first micro-batch (and outside
  // training), else the copy made then.
  Fp8Tensor weight(const Tensor& w);
  // The weight Param w for a GEMM: an FP8 primary weight (w.fp8, --fp8-param-gather) decoded from
  // its codes with the scale it was quantised with (a fresh tensor each call: only the codes
  // stay between uses), else weight(w.value).
  Fp8Tensor weight(const Param& w);
  // Block-scaled recipes: the weight as the input gradient's GEMM reads it (columnwise), after a
  // forward's weight(): mxfp8 quantises w's values once per rowwise copy, blockwise's 128 x 128
  // tiles read the same both ways (the rowwise copy).
  Fp8Tensor weight_columnwise(const Param& w);
  // --fp8-param-gather: the scale that quantises this GEMM's weight into its FP8 primary weight
  // after a step (TE's cast_master_weights_to_fp8), given the amax of the whole (tensor-parallel
  // local) weight rounded to bf16 (the max over its data-parallel shards). Delayed: the weight's
  // current scale, amax recorded as this step's weight amax (the forward's reduction and update
  // then take it, as they take the amax a first micro-batch records without the flag); tensorwise:
  // fp8_max / amax. Remembers its inverse for weight(const Param&). The same numbers as
  // quantising the bf16 weight on the next step's first micro-batch.
  float primary_weight_scale(double amax);
  // Blockwise: FP8 primary weights carry a scale per 128 x 128 tile of the (tensor-parallel local)
  // weight [out, in] (tiles row-major, ops::Fp8Tiles), from the tiles' amaxes of the weight
  // rounded to bf16 (the max over its data-parallel shards; Megatron's quantize_param_shard over
  // TE's cast_master_weights_to_fp8 for Float8BlockwiseQTensor). Returns the scales (f32 [tiles]
  // on `device`) and keeps their inverses for weight(const Param&): the same values as the tiles
  // the forward quantises from the bf16 weight without the flag.
  static constexpr int64_t kWeightTile = 128;
  bool tiled_primary_weight() const { return cfg_.recipe == Fp8Recipe::kBlockwise; }
  Tensor primary_tile_scales(const std::vector<float>& tile_amax, Device device);

  // Delayed scaling's checkpointed state (empty for tensorwise): "<linear>.fp8_scale" [3] and
  // "<linear>.fp8_amax_history" [len, 3], f32 in Param::main (not in any ParamSet).
  std::vector<Param*> state();
  // The state belongs to an MoE expert (Param::expert_parallel: written by expert-data-parallel
  // rank 0).
  void mark_expert_parallel() { scale_.expert_parallel = history_.expert_parallel = true; }

  // Phases, set by Fp8Region.
  void begin_forward(bool training, bool first_micro_batch);
  void begin_backward() { recording_ = true; }
  // The forward operands' scales (input, weight), and a recomputation's use of saved ones.
  void forward_scales(std::vector<float>* out) const;
  void begin_recompute(const float* saved);
  void end_recompute();
  // Delayed scaling: the recorded amaxes of the forward (input, weight) or backward operands,
  // appended to / read back from a buffer, and the update.
  void recorded_amaxes(bool forward, std::vector<float>* out) const;
  void set_recorded_amaxes(bool forward, const float* in);
  void update(bool forward);

 private:
  Fp8Format format_of(Operand op) const;
  // The block shape (rows, columns) of operand op read with usage u (block-scaled recipes).
  std::pair<int64_t, int64_t> block_shape(Operand op, Fp8Usage u) const;
  float* history_row0() { return history_.main.data<float>(); }
  float* scales() { return scale_.main.data<float>(); }
  float current_scale(Operand op) const;
  void record(Operand op, double amax);

  Fp8Config cfg_;
  bool delayed_;
  Param scale_, history_;  // delayed only
  Fp8Tensor weight_cache_, weight_cache_columnwise_;
  int64_t weight_version_ = 0, columnwise_version_ = -1;  // which rowwise copy the other follows
  float primary_scale_inv_ = 1.0f;                        // of the FP8 primary weight's codes
  Tensor primary_tile_scale_inv_;  // blockwise: per tile of the FP8 primary weight
  bool recording_ = false;         // amaxes of this phase are recorded
  bool fresh_weight_ = true;       // quantise the weight (else the cached copy)
  float saved_scales_[2] = {};     // the live scales while a recomputation uses old ones
  bool recomputing_ = false;
};

class Fp8Registry;

// The FP8 GEMMs of one TransformerBlock: Megatron's fp8_autocast region around the block's forward.
// Delayed scaling reduces and updates at the end of each (non-recomputed) training forward and
// after each backward, one all-reduce of the recorded amaxes: of the region's own GEMMs, or, once
// it joined an Fp8Registry, of every GEMM the registry holds (Transformer Engine's global buffer).
class Fp8Region {
 public:
  void add(Fp8GemmScaling* s) { gemms_.push_back(s); }
  // Enrolls this region's GEMMs in `registry` (delayed scaling), whose GEMMs its ends update from
  // now on.
  void join(Fp8Registry* registry);
  bool delayed() const;
  bool empty() const { return gemms_.empty(); }
  const std::vector<Fp8GemmScaling*>& gemms() const { return gemms_; }

  void begin_forward(bool training, bool first_micro_batch);
  // group: the amax reduction group (null or size 1: no reduction).
  void end_forward(bool training, ProcessGroup* group);
  void begin_backward();
  void end_backward(ProcessGroup* group);
  // Every GEMM's forward scales now (kept by a forward whose layers are recomputed), and a
  // recomputation run with them.
  std::vector<float> forward_scales() const;
  void begin_recompute(const std::vector<float>& saved);
  void end_recompute();
  // Every GEMM's checkpointed state.
  std::vector<Param*> state() const;

 private:
  void reduce_and_update(bool forward, ProcessGroup* group);
  std::vector<Fp8GemmScaling*> gemms_;
  Fp8Registry* registry_ = nullptr;
};

// Transformer Engine's global amax buffer for one rank's delayed-scaling GEMMs that share an amax
// group: the end of every fp8_autocast region, forward or backward, reduces and rolls the history
// of every module in it, those that did not run in the region included (a zero amax: the scale
// stays, the history rolls). TE enrolls a module at its first forward; here every region enrolls
// when it joins, before any step: a GEMM that never ran has an all-zero history, which a roll
// leaves as it is, so a fresh run is the same, and a resumed run (whose checkpoint cannot say
// which modules TE had enrolled) rolls exactly what the uninterrupted run rolls.
// Megatron opens several regions a step on one rank (an interleaved pipeline's model chunks,
// T5's encoder and decoder, each multi-token-prediction depth's two), so with an amax history
// longer than 1 this is what its histories and, with --fp8-amax-compute-algo max, its scales are.
// The trainer owns one and its chunks' regions join it; a region alone updates its own GEMMs.
class Fp8Registry {
 public:
  // Adds r's GEMMs (delayed scaling) after those already enrolled; again: no change.
  void enroll(Fp8Region* r);
  // One all-reduce (MAX over group, null or size 1: none) of every enrolled GEMM's recorded
  // amaxes of the pass, then every enrolled GEMM's update.
  void reduce_and_update(bool forward, ProcessGroup* group) const;
  int64_t size() const { return static_cast<int64_t>(gemms_.size()); }

 private:
  std::vector<const Fp8Region*> regions_;
  std::vector<Fp8GemmScaling*> gemms_;
};

}  // namespace megatron
