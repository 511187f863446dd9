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
//
// Megatron passes is_first_microbatch to TE's layers: the weight is quantised once per step, on
// the first micro-batch, and that copy (with its scale) serves the other micro-batches and the
// backward; its amax is recorded once per step. Activation recomputation re-runs a forward with
// the scales of the original forward (TE saves them per micro-batch) and records nothing, so a
// recomputed run computes what a stored one does. Evaluation (not training) quantises with the
// current scales and records nothing: evaluating never changes the training run.
#pragma once

#include <string>
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
  // x quantised as operand `op` (input or output gradient), recording its amax where the recipe
  // and phase say so.
  Fp8Tensor quantize(const Tensor& x, Operand op);
  // The same into `out` (bf16, or f64 for f64 x; x's size: a view into a larger tensor, such as
  // one expert's rows of a grouped GEMM's input); returns the inverse scale.
  float quantize_into(Tensor& out, const Tensor& x, Operand op);
  // The weight for this forward: quantised afresh on a step's first micro-batch (and outside
  // training), else the copy made then.
  Fp8Tensor weight(const Tensor& w);
  // The weight Param w for a GEMM: an FP8 primary weight (w.fp8, --fp8-param-gather) decoded from
  // its codes with the scale it was quantised with (a fresh tensor each call: only the codes
  // stay between uses), else weight(w.value).
  Fp8Tensor weight(const Param& w);
  // --fp8-param-gather: the scale that quantises this GEMM's weight into its FP8 primary weight
  // after a step (TE's cast_master_weights_to_fp8), given the amax of the whole (tensor-parallel
  // local) weight rounded to bf16 (the max over its data-parallel shards). Delayed: the weight's
  // current scale, amax recorded as this step's weight amax (the forward's reduction and update
  // then take it, as they take the amax a first micro-batch records without the flag); tensorwise:
  // fp8_max / amax. Remembers its inverse for weight(const Param&). The same numbers as
  // quantising the bf16 weight on the next step's first micro-batch.
  float primary_weight_scale(double amax);

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
  float* history_row0() { return history_.main.data<float>(); }
  float* scales() { return scale_.main.data<float>(); }
  float current_scale(Operand op) const;
  void record(Operand op, double amax);

  Fp8Config cfg_;
  bool delayed_;
  Param scale_, history_;  // delayed only
  Fp8Tensor weight_cache_;
  float primary_scale_inv_ = 1.0f;  // of the FP8 primary weight's codes
  bool recording_ = false;          // amaxes of this phase are recorded
  bool fresh_weight_ = true;        // quantise the weight (else the cached copy)
  float saved_scales_[2] = {};      // the live scales while a recomputation uses old ones
  bool recomputing_ = false;
};

// The FP8 GEMMs of one TransformerBlock: Megatron's fp8_autocast region around the block's forward.
// Delayed scaling reduces and updates at the end of each (non-recomputed) training forward and
// after each backward, one all-reduce of every GEMM's recorded amaxes.
class Fp8Region {
 public:
  void add(Fp8GemmScaling* s) { gemms_.push_back(s); }
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
};

}  // namespace megatron
