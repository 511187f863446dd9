// Layout and workload of a run's flags for the planner (see plan_prediction.h).
#include "train/plan_prediction.h"

#include <algorithm>

#include "core/logging.h"
#include "optim/moment_storage.h"

namespace megatron {

plan::Layout layout_from_args(const Arguments& a, int64_t world) {
  plan::Layout l;
  l.tp = a.tensor_model_parallel_size;
  l.sp = a.sequence_parallel && l.tp > 1;
  l.cp = a.context_parallel_size;
  l.pp = a.pipeline_model_parallel_size;
  l.vpp = virtual_pipeline_stages(a);
  l.split = pipeline_split(a);
  l.ep = a.expert_model_parallel_size;
  l.etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : l.tp;
  l.dp = std::max<int64_t>(1, world / (l.tp * l.cp * l.pp));
  l.mbs = a.micro_batch_size;
  l.vpp_group = a.microbatch_group_size_per_vp_stage;
  l.recompute = a.recompute_granularity == "full" ? plan::Recompute::kFull
                : a.recompute_granularity == "selective" || a.recompute_activations
                    ? plan::Recompute::kSelective
                    : plan::Recompute::kNone;
  // Megatron-FSDP's no_shard is plain data parallelism and its optim the distributed
  // optimizer's sharding.
  const std::string& strategy = a.data_parallel_sharding_strategy;
  // --use-torch-fsdp2 runs as Megatron-FSDP's optim_grads_params (optim_grads without resharding
  // after forward).
  if (a.use_torch_fsdp2) {
    l.sharding =
        a.torch_fsdp2_reshard_after_forward ? plan::Sharding::kFsdp : plan::Sharding::kFsdpGrads;
  } else {
    l.sharding = a.use_megatron_fsdp && strategy == "optim_grads_params" ? plan::Sharding::kFsdp
                 : a.use_megatron_fsdp && strategy == "optim_grads" ? plan::Sharding::kFsdpGrads
                 : (a.use_megatron_fsdp && strategy == "optim") || a.use_distributed_optimizer
                     ? plan::Sharding::kDistributedOptimizer
                     : plan::Sharding::kNone;
  }
  l.overlap_grad_reduce = a.overlap_grad_reduce;
  l.overlap_param_gather = a.overlap_param_gather;
  l.cp_comm_type = a.cp_comm_type.empty() ? "p2p" : a.cp_comm_type.front();
  l.instances = std::max<int64_t>(1, a.num_distributed_optimizer_instances);
  return l;
}

void apply_layout_to_args(const plan::Layout& l, Arguments& a) {
  a.tensor_model_parallel_size = l.tp;
  a.sequence_parallel = l.sp;
  a.context_parallel_size = l.cp;
  a.pipeline_model_parallel_size = l.pp;
  a.num_layers_per_virtual_pipeline_stage = 0;
  // A layout sets the virtual stages itself (the flags may not name them twice).
  a.num_virtual_stages_per_pipeline_rank = l.vpp > 1 && l.split.layout.empty() ? l.vpp : 0;
  a.decoder_first_pipeline_num_layers = l.split.first_stage_layers;
  a.decoder_last_pipeline_num_layers = l.split.last_stage_layers;
  a.account_for_embedding_in_pipeline_split = l.split.embedding_in_split;
  a.account_for_loss_in_pipeline_split = l.split.loss_in_split;
  a.expert_model_parallel_size = l.ep;
  a.expert_tensor_parallel_size = l.etp;
  a.micro_batch_size = l.mbs;
  a.recompute_activations = false;
  a.recompute_granularity =
      l.recompute == plan::Recompute::kNone ? "" : plan::recompute_name(l.recompute);
  a.recompute_method = l.recompute == plan::Recompute::kFull ? "uniform" : "";
  a.recompute_num_layers = l.recompute == plan::Recompute::kFull ? 1 : 0;
  a.use_distributed_optimizer = l.sharding == plan::Sharding::kDistributedOptimizer;
  a.use_torch_fsdp2 = false;  // a layout's sharding is Megatron-FSDP's (the same run)
  a.torch_fsdp2_reshard_after_forward = true;
  a.use_megatron_fsdp =
      l.sharding == plan::Sharding::kFsdp || l.sharding == plan::Sharding::kFsdpGrads;
  a.data_parallel_sharding_strategy = l.sharding == plan::Sharding::kFsdp ? "optim_grads_params"
                                      : l.sharding == plan::Sharding::kFsdpGrads ? "optim_grads"
                                                                                 : "no_shard";
  a.overlap_grad_reduce = l.overlap_grad_reduce;
  a.overlap_param_gather = l.overlap_param_gather;
  a.cp_comm_type = {l.cp_comm_type};
  a.num_distributed_optimizer_instances = l.instances;
}

double moment_bytes_from_args(const Arguments& a) {
  // SGD: one fp32 momentum buffer, or nothing without momentum.
  if (a.optimizer == "sgd") return a.sgd_momentum != 0 ? 4.0 : 0.0;
  MomentDType m = MomentDType::kF32, v = MomentDType::kF32;
  if (!parse_moment_dtype(a.exp_avg_dtype, &m) || !parse_moment_dtype(a.exp_avg_sq_dtype, &v))
    return 8.0;  // refused by the argument checks before a run gets here
  return static_cast<double>(moment_element_bytes(m) + moment_element_bytes(v));
}

plan::Workload workload_from_args(const Arguments& a, const TransformerConfig& cfg,
                                  const ModelSpec& spec, plan::ActivationRuntime runtime) {
  plan::Workload w;
  w.config = cfg;
  w.global_batch = a.global_batch_size;
  w.model_flops = spec.flops_per_iteration(cfg, a.global_batch_size);
  w.runtime = runtime;
  w.grad_reduce_in_bf16 = a.grad_reduce_in_bf16;
  w.moment_bytes = moment_bytes_from_args(a);
  // The plain optimizer keeps fp32 state (the storage flags need the distributed optimizer).
  w.plain_moment_bytes = a.optimizer != "sgd" ? 8.0 : a.sgd_momentum != 0 ? 4.0 : 0.0;
  if (a.optimizer == "muon" || a.optimizer == "lion") {
    // Megatron's emerging optimizers: one fp32 state per matrix element (Muon's buffer, Lion's
    // moment), Adam's two (Lion's one under --muon-scalar-optimizer lion) for the rest, mixed
    // per stage by the memory model (plan::Workload::emerging). The optimizer traffic takes the
    // whole model's mix. (Their layer-wise distributed optimizer is not modelled.)
    w.emerging = true;
    w.other_state_bytes = a.optimizer == "muon" && a.muon_scalar_optimizer == "lion" ? 4.0 : 8.0;
    const plan::RankParams p = plan::rank_params(cfg, plan::Layout{}, 0);  // the whole model
    if (p.total() > 0) {
      w.plain_moment_bytes = (w.matrix_state_bytes * (p.dense + p.expert) +
                              w.other_state_bytes * (p.replicated + p.embedding)) /
                             p.total();
    }
  }
  w.optimizer_traffic_bytes = 42.0 - 2.0 * (8.0 - w.plain_moment_bytes);
  return w;
}

std::string prediction_line(const plan::Prediction& p) {
  const double mb = 1048576.0;
  return strprintf(
      "planner prediction for this layout: step %.1f ms (compute %.1f, communication %.1f, "
      "bubble %.1f, data-parallel %.1f, optimizer %.1f), peak memory %.1f MB per rank "
      "(weights and optimizer %.1f, activations %.1f, runtime %.1f)",
      1e3 * p.step, 1e3 * p.compute, 1e3 * (p.tp_comm + p.cp_comm + p.ep_comm + p.pp_comm),
      1e3 * p.bubble, 1e3 * p.dp_comm, 1e3 * p.optimizer, p.total_bytes / mb,
      p.weight_and_optimizer_bytes / mb, p.activation_bytes / mb, p.runtime_bytes / mb);
}

std::string prediction_check_line(const plan::Prediction& p, double step_seconds,
                                  double max_resident_mb) {
  const double predicted_mb = p.total_bytes / 1048576.0;
  return strprintf(
      "planner vs measured: step %.1f ms predicted, %.1f ms measured (%+.1f%%); peak memory "
      "%.1f MB predicted, %.1f MB max resident (%+.1f%%)",
      1e3 * p.step, 1e3 * step_seconds, 100 * (p.step / step_seconds - 1), predicted_mb,
      max_resident_mb, 100 * (predicted_mb / max_resident_mb - 1));
}

}  // namespace megatron
