// AdamW over a ParamSet's flat fp32 buffers, with Megatron's parameter groups (no weight decay on
// biases and norm weights) and global-norm gradient clipping.
//
// Moments live in two flat buffers parallel to ParamSet::main(); a step walks the parameters and
// applies ops::adamw_step to each one's slices with its group's weight decay. Not the distributed
// optimizer (that shards these buffers over data-parallel ranks; it comes with parallelism).
#pragma once

#include <string>

#include "optim/moment_storage.h"
#include "parallel/param.h"
#include "tensor/ops.h"

namespace megatron {

// Megatron's --optimizer: adam (AdamW), sgd (momentum SGD, ops::sgd_step), and its emerging
// optimizers (optim/muon.h, class Muon): muon (Muon for the matrices, AdamW or Lion for the rest)
// and lion (Lion for the matrices with Adam's betas, AdamW for the rest).
enum class UpdateRule : uint8_t { kAdam, kSgd, kMuon, kLion };

// The optimizer's hyper-parameters (AdamW's, and SGD's with rule kSgd).
struct AdamWConfig {
  double beta1 = 0.9;          // --adam-beta1
  double beta2 = 0.999;        // --adam-beta2
  double eps = 1e-8;           // --adam-eps
  double weight_decay = 0.01;  // --weight-decay
  // The precision-aware optimizer's moment storage (--exp-avg-dtype, --exp-avg-sq-dtype;
  // MomentStorage): the distributed optimizer only, as in Megatron; AdamW keeps fp32.
  MomentDType exp_avg_dtype = MomentDType::kF32;
  MomentDType exp_avg_sq_dtype = MomentDType::kF32;
  // --optimizer sgd: the state is one momentum buffer (torch's momentum_buffer) where Adam keeps
  // exp_avg, none at all with momentum 0; weight decay is L2, added to the gradient; no bias
  // correction. Megatron's parameter groups and clipping as for Adam.
  UpdateRule rule = UpdateRule::kAdam;
  double sgd_momentum = 0.9;  // --sgd-momentum
  bool sgd() const { return rule == UpdateRule::kSgd; }
  // Muon's --muon-scalar-optimizer lion: Lion with these betas for the parameters that are not
  // its matrices (one moment, exp_avg; decoupled decay; no bias correction). --optimizer lion's
  // matrices take Adam's betas (Megatron builds that Lion from adam_beta1/2).
  double lion_beta1 = 0.95;  // --lion-beta1
  double lion_beta2 = 0.98;  // --lion-beta2
  bool muon_scalar_lion = false;
  // Megatron's emerging optimizers (muon, lion): class Muon, per-parameter state (states_of).
  bool emerging() const { return rule == UpdateRule::kMuon || rule == UpdateRule::kLion; }
  // Elements of state per owned weight: 2 (Adam), 1 (SGD with momentum), 0 (SGD without).
  int states() const { return !sgd() ? 2 : sgd_momentum != 0 ? 1 : 0; }
};
// The checkpoint name of the optimizer's first and second state tensors ("exp_avg" and
// "exp_avg_sq"; SGD's "momentum_buffer" and none).
const char* first_state_name(const AdamWConfig& cfg);
// The same for parameter p, and how many of them p has: under Muon a matrix has only its
// "momentum_buffer" (optim/muon.h's is_muon_matrix), under Lion its "exp_avg"; the others Adam's
// two, or Lion's "exp_avg" alone with --muon-scalar-optimizer lion.
const char* first_state_name(const AdamWConfig& cfg, const Param& p);
int states_of(const AdamWConfig& cfg, const Param& p);
// Which optimizers' checkpointed state another can continue: "sgd", "muon", "lion", or "adam"
// (adam, onebit_adam and any older checkpoint's). Muon's with Lion for the rest is told apart
// by the caller.
std::string optimizer_state_family(const std::string& optimizer);

// One step's hyper-parameters from the schedules (Megatron's parameter groups): the learning
// rate, the one of the word embeddings and output layer (--decoupled-lr; equal to lr without
// it), and the weight decay (applied to parameters without no_weight_decay).
struct StepRates {
  double lr = 0;
  double embedding_lr = 0;
  double weight_decay = 0;
  // --use-mup's rates (< 0: none): the hidden matrices' (lr / width_mult) and SGD's vectors'
  // (lr x width_mult), each its own schedule's; Adam's eps of the hidden matrices scaled.
  double hidden_lr = -1, vector_lr = -1;
  double hidden_eps_scale = 1;
  // The rate and decay of parameter p. The word embeddings and output layer keep theirs
  // (--decoupled-lr) under --use-mup too, as Megatron's overrides leave them.
  double lr_of(const Param& p) const {
    if (p.is_embedding_or_output) return embedding_lr;
    if (p.mup_class == Param::MupClass::kHidden && hidden_lr >= 0) return hidden_lr;
    if (p.mup_class == Param::MupClass::kVector && vector_lr >= 0) return vector_lr;
    return lr;
  }
  double eps_of(const Param& p, double eps) const {
    return p.mup_class == Param::MupClass::kHidden ? eps * hidden_eps_scale : eps;
  }
  double decay_of(const Param& p) const { return p.no_weight_decay ? 0.0 : weight_decay; }
  // The clipping factor of the separate norm group's parameters (Param::separate_norm,
  // --mtp-detach-heads), which the step applies instead of its common one; < 0: none.
  double separate_grad_scale = -1;
  double grad_scale_of(const Param& p, double grad_scale) const {
    return p.separate_norm && separate_grad_scale >= 0 ? separate_grad_scale : grad_scale;
  }
};

class AdamW {
 public:
  AdamW(ParamSet& params, const AdamWConfig& cfg);
  virtual ~AdamW() = default;

  // One update of the main weights from main_grad * grad_scale (the clipping coefficient, see
  // clip_coefficient; the gradients themselves are left as they are) at `rates`; refreshes the
  // compute copy. Increments the step counter used for bias correction.
  virtual void step(const StepRates& rates, double grad_scale = 1.0);
  // The same with learning rate lr for every parameter and the configured weight decay.
  void step(double lr, double grad_scale = 1.0) {
    step(StepRates{lr, lr, cfg_.weight_decay}, grad_scale);
  }

  int64_t steps() const { return step_; }
  // Restores the step counter (bias correction) from a checkpoint.
  virtual void set_steps(int64_t steps) { step_ = steps; }
  // Adam's moments; under SGD exp_avg() is the momentum buffer (no elements without momentum)
  // and exp_avg_sq() has no elements.
  Tensor& exp_avg() { return exp_avg_; }
  Tensor& exp_avg_sq() { return exp_avg_sq_; }
  // Where p's state k (0: exp_avg() or the momentum buffer, 1: exp_avg_sq()) starts in its
  // buffer; -1 when this rank holds none of it (Muon's layer-wise distribution). The moments are
  // parallel to ParamSet::main() here.
  virtual int64_t state_offset(const Param& p, int k) const {
    (void)k;
    return params_.offset_of(p);
  }
  // Whether each Param's state is held, and checkpointed, by one data-parallel rank (its owner)
  // rather than by every replica (written by data-parallel rank 0).
  virtual bool states_by_owner() const { return false; }
  const AdamWConfig& config() const { return cfg_; }

 protected:
  ParamSet& params_;
  AdamWConfig cfg_;
  Tensor exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

// One AdamW step's constants for parameter p at optimizer step `step` (1-based, bias correction).
ops::AdamWSpec adam_spec(const AdamWConfig& cfg, const StepRates& rates, const Param& p,
                         int64_t step, double grad_scale);
// One Lion step's constants for parameter p with betas (beta1, beta2): the lerp weights and the
// decay computed in double and rounded once, as torch receives them from Python.
ops::LionSpec lion_spec(double beta1, double beta2, const StepRates& rates, const Param& p,
                        double grad_scale);
// One SGD step's constants for parameter p at optimizer step `step` (1-based).
ops::SgdSpec sgd_spec(const AdamWConfig& cfg, const StepRates& rates, const Param& p, int64_t step,
                      double grad_scale);

// Global L2 norm of all gradients (each element once), accumulated in double.
double grad_norm(ParamSet& params);
// This rank's share of the squared global gradient norm: the sum of squares of every gradient
// except duplicates (Param::is_duplicate), so that summing it over the model-parallel group counts
// each element of the model once (Megatron's get_grad_norm_fp32).
// `only`: all parameters, or only the dense or only the expert-parallel ones (their sums reduce
// over different groups when experts are split over EP ranks). Frozen parameters are in none.
enum class ParamDomain : uint8_t { kAll, kDense, kExpert };
bool in_domain(const Param& p, ParamDomain only);
double grad_sum_squares_unique(ParamSet& params, ParamDomain only = ParamDomain::kAll);
// The parameters whose gradients form a norm: all, those outside a separate norm group (the main
// norm), or those inside it (Param::separate_norm).
enum class NormGroup : uint8_t { kAll, kMain, kSeparate };
bool in_norm_group(const Param& p, NormGroup group);
double grad_sum_squares_unique(ParamSet& params, ParamDomain only, NormGroup group);
// The zero elements of those same gradients (Megatron's count_zeros_fp32 before its model-parallel
// sum), for --log-num-zeros-in-grad.
int64_t grad_zeros_unique(ParamSet& params, ParamDomain only = ParamDomain::kAll);
// This rank's share of the squared norm of the fp32 main weights, each element of the model once
// over the model-parallel group (Megatron's calc_params_l2_norm), for --log-params-norm.
double params_sum_squares_unique(ParamSet& params, ParamDomain only = ParamDomain::kAll);
// Megatron's clip_grad_norm factor: max_norm / (norm + 1e-6) when that is < 1, else 1 (also when
// max_norm <= 0: no clipping). The trainer passes it to the optimizer's step, which applies it as
// it reads each gradient.
double clip_coefficient(double max_norm, double norm);
// Scales the gradients in place by clip_coefficient (the unfused form, for references and tests).
void clip_grads(ParamSet& params, double max_norm, double norm);

}  // namespace megatron
