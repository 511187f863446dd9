// The precision-aware optimizer's flags of `megatron train` (Megatron's
// --use-precision-aware-optimizer, --exp-avg-dtype, --exp-avg-sq-dtype), Muon's (--muon-*) and
// MuonClip's qk-clip (--qk-clip*), and Megatron's rules for them. What they do is
// optim/moment_storage.h's, optim/muon.h's and train/qk_clip.h's.
#include <string>
#include <vector>

#include "cli/train_args.h"
#include "core/error.h"
#include "models/model_spec.h"
#include "optim/moment_storage.h"
#include "optim/muon.h"

namespace megatron::cli {

void register_precision_aware_args(ArgTable& t, Arguments& a) {
  t.flag("--use-precision-aware-optimizer", a.use_precision_aware_optimizer,
         "Store the Adam moments in lower precision (--exp-avg-dtype, --exp-avg-sq-dtype) as "
         "Transformer Engine's FusedAdam does for Megatron; the update itself stays fp32 "
         "(distributed optimizer)");
  t.add("--exp-avg-dtype", a.exp_avg_dtype,
        "Storage of Adam's first moment with --use-precision-aware-optimizer: fp32, bf16, fp16 "
        "or fp8 (fp16 and fp8 scaled per parameter shard by its absmax)");
  t.add("--exp-avg-sq-dtype", a.exp_avg_sq_dtype,
        "Storage of Adam's second moment with --use-precision-aware-optimizer: fp32, bf16, fp16 "
        "or fp8 (fp16 and fp8 scaled per parameter shard by its absmax)");
}

void validate_precision_aware_args(const Arguments& a) {
  for (const auto& [flag, value] : {std::pair{"--exp-avg-dtype", &a.exp_avg_dtype},
                                    {"--exp-avg-sq-dtype", &a.exp_avg_sq_dtype}}) {
    MomentDType t{};
    MEGATRON_CHECK(parse_moment_dtype(*value, &t), flag, " must be fp32, fp16, bf16 or fp8, got '",
                   *value, "'");
    // Megatron's OptimizerConfig rule and message.
    MEGATRON_CHECK(a.use_precision_aware_optimizer || t == MomentDType::kF32, flag, " ", *value,
                   ": can only be fp32 when not using precision-aware optimizer; add "
                   "--use-precision-aware-optimizer (with --use-distributed-optimizer)");
  }
  if (!a.use_precision_aware_optimizer) return;
  MEGATRON_CHECK(a.optimizer == "adam",
                 "--use-precision-aware-optimizer only supported with adam (got --optimizer ",
                 a.optimizer, ")");
  MEGATRON_CHECK(a.use_distributed_optimizer,
                 "--use-precision-aware-optimizer only supported with distributed optimizer: add "
                 "--use-distributed-optimizer (or --use-megatron-fsdp with a sharding strategy "
                 "other than no_shard)");
}

void register_muon_args(ArgTable& t, Arguments& a) {
  t.add("--muon-momentum", a.muon_momentum, "Momentum factor for the Muon optimizer");
  t.negative_flag("--muon-no-split-qkv", "muon_split_qkv", a.muon_split_qkv,
                  "Muon: orthogonalise a fused QKV weight whole instead of its queries, keys and "
                  "values apart");
  t.flag("--muon-nesterov", a.muon_nesterov,
         "Muon: Nesterov-style momentum ((1 - momentum) gradient + momentum x buffer)");
  t.add("--muon-scale-mode", a.muon_scale_mode,
        "Muon's update scale for an [out, in] matrix: spectral (sqrt(max(out, in))), "
        "unit_rms_norm (sqrt(out / in)) or shape_scaling (sqrt(max(1, out / in)))");
  t.add("--muon-fp32-matmul-prec", a.muon_fp32_matmul_prec,
        "Precision of the Newton-Schulz products: medium (bf16 inputs and outputs, f32 "
        "accumulation, as Megatron under torch's medium) or high (f32); low is refused");
  t.add("--muon-coefficient-type", a.muon_coefficient_type,
        "Newton-Schulz coefficients: simple, quintic, polar_express or aol");
  t.add("--muon-num-ns-steps", a.muon_num_ns_steps, "Newton-Schulz steps of the Muon optimizer");
  t.add("--muon-tp-mode", a.muon_tp_mode,
        "Newton-Schulz of tensor-parallel weights: blockwise (each shard alone), duplicated "
        "(the whole matrix on every rank) or distributed (Gram matrices summed over the group)");
  t.add("--muon-extra-scale-factor", a.muon_extra_scale_factor,
        "Additional scale factor of the Muon update");
  t.add("--muon-scalar-optimizer", a.muon_scalar_optimizer,
        "Optimizer of the parameters Muon leaves out (embeddings, output layer, biases, norms): "
        "adam or lion");
  t.add("--lion-beta1", a.lion_beta1,
        "First beta of the Lion on Muon's other parameters (--muon-scalar-optimizer lion): the "
        "interpolation whose sign is the update (--optimizer lion takes --adam-beta1, as "
        "Megatron builds it)");
  t.add("--lion-beta2", a.lion_beta2,
        "Second beta of the Lion on Muon's other parameters: its moment's decay (--optimizer "
        "lion takes --adam-beta2)");
}

std::vector<std::string> validate_muon_args(Arguments& a) {
  std::vector<std::string> notes;
  // Megatron's argparse choices, checked whatever the optimizer (as argparse does).
  MuonScaleMode scale{};
  MEGATRON_CHECK(parse_muon_scale_mode(a.muon_scale_mode, &scale),
                 "--muon-scale-mode must be spectral, unit_rms_norm or shape_scaling, got '",
                 a.muon_scale_mode, "'");
  MuonTpMode mode{};
  MEGATRON_CHECK(parse_muon_tp_mode(a.muon_tp_mode, &mode),
                 "--muon-tp-mode must be blockwise, duplicated or distributed, got '",
                 a.muon_tp_mode, "'");
  MEGATRON_CHECK(a.muon_fp32_matmul_prec == "low" || a.muon_fp32_matmul_prec == "medium" ||
                     a.muon_fp32_matmul_prec == "high",
                 "--muon-fp32-matmul-prec must be low, medium or high, got '",
                 a.muon_fp32_matmul_prec, "'");
  // Megatron's rewrite: dist_muon is muon with the layer-wise distributed optimizer, and so is
  // muon with --use-distributed-optimizer (whose flag it then clears: the gradients are
  // all-reduced, each parameter's state kept by one replica; optim/muon.h).
  if (a.optimizer == "dist_muon") {
    notes.push_back(
        "optimizer='dist_muon' is deprecated. Use --optimizer muon --use-distributed-optimizer "
        "instead.");
    a.optimizer = "muon";
    a.use_layer_wise_distributed_optimizer = true;
  }
  // emerging_optimizers' Lion constructor checks, on the betas each Lion takes: Muon's other
  // parameters --lion-beta1/2, --optimizer lion's matrices Adam's (Megatron's registry entry).
  const bool scalar_lion = a.optimizer == "muon" && a.muon_scalar_optimizer == "lion";
  if (scalar_lion || a.optimizer == "lion") {
    const bool adam_betas = a.optimizer == "lion";
    for (const auto& [flag, value] :
         {std::pair{adam_betas ? "--adam-beta1" : "--lion-beta1",
                    adam_betas ? a.adam_beta1 : a.lion_beta1},
          {adam_betas ? "--adam-beta2" : "--lion-beta2", adam_betas ? a.adam_beta2 : a.lion_beta2}})
      MEGATRON_CHECK(value >= 0 && value < 1, "Invalid beta: ", flag, " must be in [0, 1), got ",
                     value, adam_betas ? " (--optimizer lion takes Adam's betas)" : "");
  }
  if (a.optimizer != "muon" && a.optimizer != "lion") return notes;
  const std::string& o = a.optimizer;
  if (o == "muon") {
    MEGATRON_CHECK(!muon_coefficients(a.muon_coefficient_type, 1).empty(),
                   "Unsupported muon coefficient type '", a.muon_coefficient_type,
                   "'. Supported types: simple, quintic, polar_express, aol");
    // Megatron offers low, which torch's set_float32_matmul_precision rejects at the first step.
    MEGATRON_CHECK(a.muon_fp32_matmul_prec != "low",
                   "--muon-fp32-matmul-prec low is not a matmul precision (torch rejects it at "
                   "the first step): use medium (bf16 Newton-Schulz) or high (f32)");
    MEGATRON_CHECK(a.muon_num_ns_steps >= 1, "--muon-num-ns-steps must be at least 1, got ",
                   a.muon_num_ns_steps);
    MEGATRON_CHECK(a.muon_momentum >= 0 && a.muon_momentum < 1,
                   "--muon-momentum must be in [0, 1), got ", a.muon_momentum);
    MEGATRON_CHECK(a.muon_scalar_optimizer == "adam" || a.muon_scalar_optimizer == "lion",
                   "--muon-scalar-optimizer must be adam or lion, got '", a.muon_scalar_optimizer,
                   "'");
  }
  // Megatron's rules for every emerging optimizer.
  MEGATRON_CHECK(!a.fp16, "--optimizer ", o,
                 " with --fp16: emerging optimizer with fp16 is not supported (Megatron's rule); "
                 "use --bf16");
  MEGATRON_CHECK(!a.use_megatron_fsdp && !a.use_torch_fsdp2, "--optimizer ", o,
                 " with Megatron-FSDP or torch FSDP2: emerging optimizers do not support FSDP "
                 "(Megatron's rule); drop --use-megatron-fsdp / --use-torch-fsdp2");
  if (a.use_distributed_optimizer) {
    a.use_layer_wise_distributed_optimizer = true;
    a.use_distributed_optimizer = false;
  }
  if (a.use_layer_wise_distributed_optimizer) {
    MEGATRON_CHECK(a.num_distributed_optimizer_instances == 1,
                   "--num-distributed-optimizer-instances with the layer-wise distributed "
                   "optimizer (--optimizer ",
                   o,
                   " --use-distributed-optimizer) is not supported: "
                   "drop it");
    MEGATRON_CHECK(!a.overlap_param_gather,
                   "--overlap-param-gather with the layer-wise distributed optimizer (--optimizer ",
                   o,
                   " --use-distributed-optimizer) is not implemented here (its parameters are "
                   "broadcast after the step): drop --overlap-param-gather");
    MEGATRON_CHECK(!a.fp8_param_gather,
                   "--fp8-param-gather with the layer-wise distributed optimizer (--optimizer ", o,
                   " --use-distributed-optimizer) is not implemented here: drop "
                   "--fp8-param-gather");
  }
  return notes;
}

void register_qk_clip_args(ArgTable& t, Arguments& a) {
  t.flag("--qk-clip", a.qk_clip,
         "MuonClip's qk-clip: after each step, shrink the query and key weights of every query "
         "group (MLA: head) whose largest attention score of the step exceeded "
         "--qk-clip-threshold, so that it would have been the threshold");
  t.add("--qk-clip-alpha", a.qk_clip_alpha,
        "qk-clip's balance: the queries shrink by eta^alpha, the keys by eta^(1 - alpha), eta = "
        "threshold / largest score");
  t.add("--qk-clip-threshold", a.qk_clip_threshold,
        "qk-clip's bound on the attention scores (scaled q . k)");
  t.flag("--log-max-attention-logit", a.log_max_attention_logit,
         "Log the largest attention score of each step over the whole model (also with "
         "--qk-clip)");
}

std::vector<std::string> validate_qk_clip_args(const Arguments& a) {
  std::vector<std::string> notes;
  if (a.qk_clip) {
    // Megatron's rules and messages.
    MEGATRON_CHECK(a.qk_clip_alpha > 0.0 && a.qk_clip_alpha < 1.0,
                   "--qk-clip-alpha must be between 0.0 and 1.0 when using --qk-clip (got ",
                   a.qk_clip_alpha, ")");
    MEGATRON_CHECK(a.qk_clip_threshold > 0,
                   "--qk-clip-threshold must be greater than 0 when using --qk-clip (got ",
                   a.qk_clip_threshold, ")");
  }
  if (!a.qk_clip && !a.log_max_attention_logit) return notes;
  const char* flag = a.qk_clip ? "--qk-clip" : "--log-max-attention-logit";
  // Megatron's clip_qk walks the decoder's layers: models without one have nothing it reads.
  const std::string& model = model_spec(a.model).name;
  MEGATRON_CHECK(model != "bert" && model != "bert_classification", flag,
                 " reads the self-attention layers of a decoder (Megatron's clip_qk); --model ",
                 a.model, " has none");
  // (MLA's --qk-layernorm normalises the latents, before the clipped up-projections.)
  if (a.qk_clip && (a.qk_layernorm || a.qk_l2_norm) && !a.multi_latent_attention) {
    notes.push_back(std::string(a.qk_l2_norm ? "--qk-l2-norm" : "--qk-layernorm") +
                    " normalises each query and key head after linear_qkv: --qk-clip's shrinking "
                    "of their rows changes no attention score, and the clipped rows keep "
                    "shrinking every step (as in Megatron)");
  }
  return notes;
}

}  // namespace megatron::cli
