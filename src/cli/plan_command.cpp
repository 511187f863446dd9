// `megatron plan`: the parallel layouts of a training job on a cluster, predicted and ranked
// before any compute is spent (plan/planner.h), with the launch line of each.
//
// Takes `train`'s model flags (or --pretrained-checkpoint DIR for a Hugging Face config.json),
// --global-batch-size and --seq-length, and a cluster (--gpu PRESET or cpu, nodes x devices).
// Layout flags given on the command line (--tensor-model-parallel-size, --micro-batch-size,
// --recompute-granularity, ...) fix that degree; the rest is searched. --evaluate predicts the
// one layout the flags describe, as `train` would run it. Every candidate passes `train`'s own
// flag validation, so each printed command line starts.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/megatron_flags.h"
#include "cli/mpi_command.h"
#include "cli/train_args.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/threads.h"
#include "models/model_spec.h"
#include "plan/planner.h"
#include "train/cpu_calibration.h"
#include "train/model_config.h"
#include "train/plan_prediction.h"

namespace megatron::cli {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The flags a layout sets: dropped from the user's command line, then written from the layout.
const std::set<std::string>& layout_flags() {
  static const std::set<std::string> flags = {"--tensor-model-parallel-size",
                                              "--pipeline-model-parallel-size",
                                              "--context-parallel-size",
                                              "--expert-model-parallel-size",
                                              "--expert-tensor-parallel-size",
                                              "--sequence-parallel",
                                              "--num-layers-per-virtual-pipeline-stage",
                                              "--num-virtual-stages-per-pipeline-rank",
                                              "--micro-batch-size",
                                              "--recompute-granularity",
                                              "--recompute-method",
                                              "--recompute-num-layers",
                                              "--recompute-activations",
                                              "--use-distributed-optimizer",
                                              "--use-megatron-fsdp",
                                              "--data-parallel-sharding-strategy",
                                              "--overlap-grad-reduce",
                                              "--overlap-param-gather",
                                              "--cp-comm-type",
                                              "--num-distributed-optimizer-instances",
                                              "--use-torch-fsdp2",
                                              "--torch-fsdp2-no-reshard-after-forward"};
  return flags;
}

struct PlanOptions {
  std::string gpu;
  int64_t nodes = 1, per_node = 0;
  double intra_bw = 0, intra_latency_us = -1, inter_bw = 0, inter_latency_us = -1;
  double overhead_ms = -1;
  int64_t top = 10, max_mbs = 16;
  bool json = false, evaluate = false;
};
const std::set<std::string>& plan_value_flags() {
  static const std::set<std::string> flags = {"--gpu",
                                              "--num-nodes",
                                              "--gpus-per-node",
                                              "--intra-node-bandwidth",
                                              "--intra-node-latency",
                                              "--inter-node-bandwidth",
                                              "--inter-node-latency",
                                              "--iteration-overhead",
                                              "--top",
                                              "--max-micro-batch-size"};
  return flags;
}

// A word as a POSIX shell reads it back: as it is when it holds only safe characters, else in
// single quotes (a layout string's '|' would be a pipe, its '(' a subshell).
std::string shell_word(const std::string& word) {
  const bool safe = !word.empty() && word.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_=./:,+@%") == std::string::npos;
  if (safe) return word;
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// The launch line of a layout: the user's flags (less the layout's and the planner's) and the
// layout's.
std::string command_line(int argc, char** argv, const ModelSpec& spec, const plan::Layout& l,
                         const plan::Cluster& c) {
  std::string out = strprintf("mpiexec -n %ld", static_cast<long>(l.world()));
  if (c.nodes > 1)
    out += strprintf(" --map-by ppr:%ld:node", static_cast<long>(c.devices_per_node));
  out += " megatron " + spec.entry_point;
  bool skipping = false;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) == 0) {
      const std::string flag = word.substr(0, word.find('='));
      skipping = layout_flags().count(flag) || plan_value_flags().count(flag) || flag == "--json" ||
                 flag == "--evaluate" || flag == "--model";
      if (skipping) continue;
    } else if (skipping) {
      continue;
    }
    out += " " + shell_word(word);
  }
  auto num = [&](const char* flag, int64_t v) {
    out += strprintf(" %s %ld", flag, static_cast<long>(v));
  };
  if (l.tp > 1) num("--tensor-model-parallel-size", l.tp);
  if (l.sp) out += " --sequence-parallel";
  if (l.cp > 1) num("--context-parallel-size", l.cp);
  if (l.cp > 1 && l.cp_comm_type != "p2p") out += " --cp-comm-type " + l.cp_comm_type;
  if (l.pp > 1) num("--pipeline-model-parallel-size", l.pp);
  if (l.vpp > 1 && l.split.layout.empty()) num("--num-virtual-stages-per-pipeline-rank", l.vpp);
  if (l.ep > 1) num("--expert-model-parallel-size", l.ep);
  if (l.etp != l.tp) num("--expert-tensor-parallel-size", l.etp);
  num("--micro-batch-size", l.mbs);
  if (l.recompute == plan::Recompute::kSelective) out += " --recompute-granularity selective";
  if (l.recompute == plan::Recompute::kFull)
    out += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  if (l.sharding == plan::Sharding::kDistributedOptimizer) out += " --use-distributed-optimizer";
  if (l.sharding == plan::Sharding::kFsdpGrads)
    out += " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads";
  if (l.sharding == plan::Sharding::kFsdp)
    out += " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params";
  if (l.overlap_grad_reduce) out += " --overlap-grad-reduce";
  if (l.overlap_param_gather) out += " --overlap-param-gather";
  if (l.instances > 1) num("--num-distributed-optimizer-instances", l.instances);
  return out;
}

nlohmann::json to_json(const plan::Candidate& cand, const std::string& command) {
  const plan::Layout& l = cand.layout;
  const plan::Prediction& p = cand.prediction;
  return {{"layout",
           {{"tp", l.tp},
            {"sp", l.sp},
            {"cp", l.cp},
            {"pp", l.pp},
            {"vpp", l.vpp},
            {"ep", l.ep},
            {"etp", l.etp},
            {"dp", l.dp},
            {"micro_batch_size", l.mbs},
            {"recompute", plan::recompute_name(l.recompute)},
            {"sharding", plan::sharding_name(l.sharding)},
            {"distributed_optimizer_instances", l.instances},
            {"overlap_grad_reduce", l.overlap_grad_reduce},
            {"overlap_param_gather", l.overlap_param_gather}}},
          {"name", plan::layout_name(l)},
          {"fits", cand.fits},
          {"step_seconds", p.step},
          {"seconds",
           {{"compute", p.compute},
            {"gemm", p.gemm},
            {"attention", p.attention},
            {"elementwise", p.elementwise},
            {"embedding_and_head", p.ends},
            {"tp_comm", p.tp_comm},
            {"cp_comm", p.cp_comm},
            {"ep_comm", p.ep_comm},
            {"pp_comm", p.pp_comm},
            {"bubble", p.bubble},
            {"dp_comm", p.dp_comm},
            {"optimizer", p.optimizer},
            {"overhead", p.overhead}}},
          {"memory_bytes",
           {{"weights_and_optimizer", p.weight_and_optimizer_bytes},
            {"activations", p.activation_bytes},
            {"runtime", p.runtime_bytes},
            {"total", p.total_bytes},
            {"stage", p.most_loaded_stage}}},
          {"parameters_on_rank", p.params.total()},
          {"tflops_per_device", p.tflops_per_device},
          {"mfu", p.mfu},
          {"tokens_per_second", p.tokens_per_second},
          {"command", command}};
}

std::string table_row(size_t rank, const plan::Candidate& c, double device_gib) {
  const plan::Prediction& p = c.prediction;
  return strprintf(
      "%3zu  %-44s %9.3f %10.0f %8.1f %6.1f%% %7.2f/%.0f%s  %5.1f%% %5.1f%% %5.1f%% %5.1f%%", rank,
      plan::layout_name(c.layout).c_str(), p.step, p.tokens_per_second, p.tflops_per_device,
      100 * p.mfu, p.total_bytes / kGiB, device_gib, c.fits ? " " : "!", 100 * p.compute / p.step,
      100 * (p.tp_comm + p.cp_comm + p.ep_comm + p.pp_comm) / p.step, 100 * p.bubble / p.step,
      100 * p.dp_comm / p.step);
}

int run_plan(int argc, char** argv, MpiRuntime& mpi) {
  CLI::App app(
      "Choose the parallel layout of a training run: predicted step time and memory of "
      "every valid layout on a cluster, ranked",
      "plan");
  Arguments args;
  ArgTable table(app);
  register_train_args(table, args);
  const MegatronCompatFlags compat(table);
  PlanOptions o;
  app.add_option("--gpu", o.gpu,
                 "The devices: a100-80, h100-80, h200, b200, or cpu (this machine, measured)")
      ->required();
  app.add_option("--num-nodes", o.nodes, "Nodes")->capture_default_str();
  app.add_option("--gpus-per-node", o.per_node,
                 "Devices per node (default 8; with --gpu cpu the ranks to plan on this machine, "
                 "default its cores)");
  app.add_option("--intra-node-bandwidth", o.intra_bw, "GB/s per device inside a node (preset's)");
  app.add_option("--intra-node-latency", o.intra_latency_us,
                 "us per collective step inside a node");
  app.add_option("--inter-node-bandwidth", o.inter_bw, "GB/s per device across nodes (preset's)");
  app.add_option("--inter-node-latency", o.inter_latency_us, "us per collective step across nodes");
  app.add_option("--iteration-overhead", o.overhead_ms,
                 "ms per iteration besides the model (default 0 on GPU presets, 2 on cpu: the "
                 "trainer's batch and reductions)");
  app.add_option("--top", o.top, "Layouts to print (0: all)")->capture_default_str();
  app.add_option("--max-micro-batch-size", o.max_mbs, "Largest micro-batch size searched")
      ->capture_default_str();
  app.add_flag("--json", o.json, "One JSON document instead of the table");
  app.add_flag("--evaluate", o.evaluate,
               "Predict only the layout the flags describe (unset degrees are 1)");
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    compat.resolve();
    MEGATRON_CHECK(table.given("--global-batch-size"),
                   "plan needs --global-batch-size (the sequences per iteration)");
    merge_pretrained_config(args, table);
    resolve_encoder_decoder(args, table, /*training=*/false);
    MEGATRON_CHECK(args.model == "gpt",
                   "plan models GPT-style decoders (--model gpt, pretrain_gpt); got --model ",
                   args.model);
    MEGATRON_CHECK(args.heterogeneous_layers_config_path.empty() &&
                       args.heterogeneous_layers_config_encoded_json.empty(),
                   "plan models decoders of identical layers; heterogeneous layers "
                   "(--heterogeneous-layers-config-path) are not modeled: plan the uniform model "
                   "of the flags without it for an upper bound");
    MEGATRON_CHECK(args.moe_latent_size == 0,
                   "plan does not model LatentMoE (--moe-latent-size): plan the model without it "
                   "(its experts at the hidden size) for an upper bound");
    resolve_vocab_size(args, table);
    MEGATRON_CHECK(o.nodes >= 1, "--num-nodes must be at least 1, got ", o.nodes);
    MEGATRON_CHECK(o.per_node >= 0, "--gpus-per-node must be positive, got ", o.per_node);
    if (o.gpu != "cpu") plan::gpu_preset(o.gpu);  // refuses an unknown name
    transformer_config_from_args(args);
  });
  if (rc >= 0) return rc;

  // The cluster.
  plan::Cluster cluster;
  if (o.gpu == "cpu") {
    MEGATRON_CHECK(o.nodes == 1, "--gpu cpu plans this machine alone: drop --num-nodes");
    // Under mpiexec a rank may be bound to one core: the node's cores are its ranks' together.
    const int64_t cores = mpi.world_size() > 1 ? mpi.node_cores() : available_cores();
    const int64_t ranks = o.per_node > 0 ? o.per_node : cores;
    // Measured alone, a rank stands for one of `ranks` sharing the cores; under mpiexec with the
    // planned ranks every rank measures at once, sharing them for real.
    const bool together = mpi.world_size() == ranks;
    CpuCalibration cal;
    cal.ranks = ranks;
    cal.threads = static_cast<int>(std::max<int64_t>(1, cores / ranks));
    cal.stretch = together ? 1.0 : static_cast<double>(ranks) / static_cast<double>(cores);
    cal.group = mpi.world_size() > 1 ? mpi.world().get() : nullptr;
    cal.ranks_per_core = static_cast<double>(ranks) / static_cast<double>(cores);
    cluster = calibrate_cpu_cluster(cal);
  } else {
    cluster.device = plan::gpu_preset(o.gpu);
    cluster.devices_per_node = o.per_node > 0 ? o.per_node : 8;
    cluster.intra = plan::preset_intra_link(o.gpu);
    cluster.inter = plan::preset_inter_link(o.gpu);
  }
  cluster.nodes = o.nodes;
  if (o.intra_bw > 0) cluster.intra.bandwidth = o.intra_bw * 1e9;
  if (o.inter_bw > 0) cluster.inter.bandwidth = o.inter_bw * 1e9;
  if (o.intra_latency_us >= 0) cluster.intra.latency = o.intra_latency_us * 1e-6;
  if (o.inter_latency_us >= 0) cluster.inter.latency = o.inter_latency_us * 1e-6;
  if (o.overhead_ms >= 0) cluster.iteration_overhead = o.overhead_ms * 1e-3;
  // Every rank plans (measuring each shape when the rank next to it does, as in the run); rank 0
  // prints.
  const bool printer = mpi.rank() == 0;

  const ModelSpec& spec = model_spec(args.model);
  plan::PlanRequest request;
  request.cluster = cluster;
  request.max_micro_batch = o.max_mbs;
  request.workload = workload_from_args(
      args, transformer_config_from_args(args), spec,
      o.gpu == "cpu" ? plan::ActivationRuntime::kThisProject : plan::ActivationRuntime::kMegatron);
  const plan::Workload& w = request.workload;
  const int64_t world = cluster.world();

  std::string first_refusal;  // for the message when nothing is left
  auto refuse = [&](const plan::Layout& l) -> std::string {
    Arguments a = args;
    apply_layout_to_args(l, a);
    // The data does not shape the layout: a plan without data paths checks as mock data.
    if (a.data_path.empty() && a.train_data_path.empty()) a.mock_data = true;
    if (a.train_iters == 0 && a.train_samples == 0) a.train_iters = 1;
    try {
      validate_train_args(a, static_cast<int>(world), /*rank=*/1);
      transformer_config_from_args(a);
      // Its memory and traffic are neither ZeRO-1's nor plain data parallelism's.
      MEGATRON_CHECK(!a.use_layer_wise_distributed_optimizer,
                     "the planner does not model the layer-wise distributed optimizer "
                     "(--use-distributed-optimizer with --optimizer muon or lion)");
    } catch (const InvalidArgument& e) {
      if (first_refusal.empty()) first_refusal = plan::layout_name(l) + ": " + e.what();
      return e.what();
    }
    return "";
  };

  std::vector<plan::Candidate> ranked;
  if (o.evaluate) {
    const plan::Layout l = layout_from_args(args, world);
    const std::string rule = plan::layout_rule_violation(w, l, world);
    MEGATRON_CHECK(rule.empty(), "the layout of the flags (", plan::layout_name(l),
                   ") cannot run on ", world, " devices: ", rule);
    const std::string why = refuse(l);
    MEGATRON_CHECK(why.empty(), "the layout of the flags cannot run: ", why);
    plan::Candidate c;
    c.layout = l;
    c.prediction = plan::predict(w, l, cluster);
    c.fits = c.prediction.total_bytes <= cluster.device.memory_bytes;
    ranked.push_back(c);
  } else {
    plan::Constraints& k = request.constraints;
    auto fixed = [&](const char* flag, int64_t v) { return table.given(flag) ? v : 0; };
    k.tp = fixed("--tensor-model-parallel-size", args.tensor_model_parallel_size);
    k.pp = fixed("--pipeline-model-parallel-size", args.pipeline_model_parallel_size);
    k.cp = fixed("--context-parallel-size", args.context_parallel_size);
    k.ep = fixed("--expert-model-parallel-size", args.expert_model_parallel_size);
    k.etp = fixed("--expert-tensor-parallel-size", args.expert_tensor_parallel_size);
    k.mbs = fixed("--micro-batch-size", args.micro_batch_size);
    k.split = pipeline_split(args);  // given split flags apply to every layout
    k.vpp_group = args.microbatch_group_size_per_vp_stage;
    k.instances = std::max<int64_t>(1, args.num_distributed_optimizer_instances);
    if (table.given("--num-virtual-stages-per-pipeline-rank") ||
        table.given("--num-layers-per-virtual-pipeline-stage"))
      k.vpp = layout_from_args(args, world).vpp;
    if (table.given("--recompute-granularity") || table.given("--recompute-activations"))
      k.recompute = plan::recompute_name(layout_from_args(args, world).recompute);
    if (table.given("--cp-comm-type")) k.cp_comm_type = layout_from_args(args, world).cp_comm_type;
    if (table.given("--use-distributed-optimizer") || table.given("--use-megatron-fsdp") ||
        table.given("--use-torch-fsdp2"))
      k.sharding = plan::sharding_name(layout_from_args(args, world).sharding);
    request.refuse = refuse;
    ranked = plan::plan_layouts(request);
    MEGATRON_CHECK(!ranked.empty(), "no layout of this model runs on ", world,
                   " devices with --global-batch-size ", w.global_batch,
                   " under the fixed flags: the devices must factor into tp x cp x pp x dp with tp "
                   "dividing the heads (",
                   w.config.num_attention_heads, ") and query groups, pp the layers (",
                   w.config.num_layers,
                   "), and micro-batch x dp the global batch; change "
                   "--num-nodes/--gpus-per-node, --global-batch-size or drop a fixed layout flag",
                   first_refusal.empty() ? "" : " (the flag check refused " + first_refusal + ")");
    if (!ranked.front().fits) {
      const plan::Candidate& least = ranked.front();
      // How many nodes the smallest layout would need at its memory, roughly (memory per device
      // falls about in proportion to the devices for weights and optimizer state).
      MEGATRON_CHECK(false, "no layout fits in ", cluster.device.memory_bytes / kGiB,
                     " GiB per device: the ", "least memory is ",
                     least.prediction.total_bytes / kGiB, " GiB (", plan::layout_name(least.layout),
                     "; weights and optimizer ", least.prediction.weight_and_optimizer_bytes / kGiB,
                     " GiB, activations ", least.prediction.activation_bytes / kGiB,
                     " GiB); give more devices (--num-nodes) or larger ones (--gpu), or a smaller "
                     "--global-batch-size or --seq-length");
    }
  }

  const size_t shown =
      o.top > 0 ? std::min<size_t>(ranked.size(), static_cast<size_t>(o.top)) : ranked.size();
  const ModelSpec& entry = spec;
  if (!printer) return 0;
  if (o.json) {
    nlohmann::json doc;
    doc["cluster"] = {
        {"device", cluster.device.name},
        {"nodes", cluster.nodes},
        {"devices_per_node", cluster.devices_per_node},
        {"peak_flops", plan::peak_flops(cluster.device, w.config.compute_dtype, false)},
        {"memory_bytes", cluster.device.memory_bytes},
        {"memory_bandwidth", cluster.device.memory_bw},
        {"intra_node",
         {{"bandwidth", cluster.intra.bandwidth}, {"latency", cluster.intra.latency}}},
        {"inter_node",
         {{"bandwidth", cluster.inter.bandwidth}, {"latency", cluster.inter.latency}}}};
    doc["model"] = {{"flops_per_iteration", w.model_flops},
                    {"global_batch_size", w.global_batch},
                    {"seq_length", w.config.seq_length}};
    doc["candidates"] = ranked.size();
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i)
      list.push_back(
          to_json(ranked[i], command_line(argc, argv, entry, ranked[i].layout, cluster)));
    doc["layouts"] = list;
    std::printf("%s\n", doc.dump(1).c_str());
    return 0;
  }
  std::printf(
      "plan: %s on %ld x %ld %s (%.0f GiB, %.0f TFLOP/s %s each); global batch %ld x %ld "
      "tokens; %zu valid layouts\n",
      args.model.c_str(), static_cast<long>(cluster.nodes),
      static_cast<long>(cluster.devices_per_node), cluster.device.name.c_str(),
      cluster.device.memory_bytes / kGiB,
      plan::peak_flops(cluster.device, w.config.compute_dtype, false) / 1e12,
      dtype_name(w.config.compute_dtype), static_cast<long>(w.global_batch),
      static_cast<long>(w.config.seq_length), ranked.size());
  std::printf("%3s  %-44s %9s %10s %8s %7s %12s  %6s %6s %6s %6s\n", "#", "layout", "step s",
              "tokens/s", "TFLOP/s", "MFU", "mem GiB", "comp", "comm", "bubble", "dp");
  for (size_t i = 0; i < shown; ++i)
    std::printf("%s\n", table_row(i + 1, ranked[i], cluster.device.memory_bytes / kGiB).c_str());
  std::printf(
      "(TFLOP/s and MFU by Megatron's model FLOPs; comp/comm/bubble/dp: shares of the "
      "step; ! = does not fit)\n\n");
  // Each layout's launch line (add the data and optimizer flags of the run).
  for (size_t i = 0; i < shown; ++i)
    std::printf("%s%zu: %s\n", i == 0 ? "best " : "", i + 1,
                command_line(argc, argv, entry, ranked[i].layout, cluster).c_str());
  return 0;
}

}  // namespace

int plan_command(int argc, char** argv) {
  MpiRuntime mpi;
  return run_mpi_command(mpi, [&](MpiRuntime& m) { return run_plan(argc, argv, m); });
}

}  // namespace megatron::cli
