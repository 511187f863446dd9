// Dense checkpoint -> MoE checkpoint (Megatron's upcycling): see the header.
#include "cli/upcycling.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "checkpoint/sharded_checkpoint.h"
#include "cli/whole_model.h"
#include "core/error.h"
#include "core/logging.h"
#include "train/checkpointing.h"

namespace megatron::cli {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "...mlp.experts.local_experts.<e>.linear_fc<k>.weight" -> (e, "...mlp.linear_fc<k>.weight"),
// or e = -1 when the name is not an expert's.
std::pair<int64_t, std::string> expert_source(const std::string& name) {
  const std::string tag = ".mlp.experts.local_experts.";
  const size_t at = name.find(tag);
  if (at == std::string::npos) return {-1, {}};
  const size_t begin = at + tag.size(), end = name.find('.', begin);
  return {std::stoll(name.substr(begin, end - begin)),
          name.substr(0, at) + ".mlp" + name.substr(end)};
}

}  // namespace

void upcycle_checkpoint(const Arguments& run) {
  namespace cp = checkpoint;
  MEGATRON_CHECK(!run.save.empty(),
                 "--moe-use-upcycling needs --save (where the MoE checkpoint "
                 "is written), as Megatron asserts");
  MEGATRON_CHECK(!run.load.empty(),
                 "--moe-use-upcycling needs --load: the dense checkpoint to "
                 "upcycle");
  MEGATRON_CHECK(run.num_experts > 0, "--moe-use-upcycling needs --num-experts (the MoE model)");
  MEGATRON_CHECK(!cp::read_tracker(run.save).has_value(), "--save ", run.save,
                 " already holds a checkpoint: upcycling runs once, when converting the dense "
                 "model; drop --moe-use-upcycling for the runs after it (Megatron's rule)");
  const int64_t g = run.moe_upcycling_granularity;
  MEGATRON_CHECK(g >= 1, "--moe-upcycling-granularity must be >= 1, got ", g);

  WholeModel dense = whole_model_from_checkpoint(run.load, run.ckpt_step);
  MEGATRON_CHECK(!dense.cfg.moe.enabled(), "--moe-use-upcycling: --load ", run.load,
                 " holds an MoE model; upcycling takes a dense one");
  WholeModel moe;
  moe.args = run;
  // One process holds the whole model (the run loads it into its own layout afterwards).
  moe.args.tensor_model_parallel_size = moe.args.pipeline_model_parallel_size = 1;
  moe.args.context_parallel_size = moe.args.expert_model_parallel_size = 1;
  moe.args.expert_tensor_parallel_size = 0;
  moe.args.num_layers_per_virtual_pipeline_stage = moe.args.num_virtual_stages_per_pipeline_rank =
      0;
  build_whole_model(moe);
  moe.params->initialize(static_cast<uint64_t>(run.seed));

  const TransformerConfig &d = dense.cfg, &m = moe.cfg;
  // Every model argument but the MoE ones and the FFN width must be the dense checkpoint's (as
  // Megatron builds the dense model from the MoE run's own flags and its loader compares them).
  {
    nlohmann::json dj = model_args_json(dense.args, d), mj = model_args_json(moe.args, m);
    for (const char* key : {"num_experts", "moe_layer_pattern", "moe_ffn_hidden_size",
                            "moe_shared_expert_intermediate_size", "moe_router_enable_expert_bias",
                            "moe_shared_expert_gate", "ffn_hidden_size"}) {
      dj.erase(key);
      mj.erase(key);
    }
    // A hybrid model's E layers upcycle the dense model's MLP layers (-) at their places (an
    // extension: Megatron's upcycling builds the dense model from the MoE run's own pattern).
    if (m.mamba.enabled() && d.mamba.enabled()) {
      // The decoder's layers and an MTP depth's alike.
      auto as_dense = [](std::string l) {
        std::replace(l.begin(), l.end(), 'E', '-');
        return l;
      };
      const bool dense_has_e = (d.mamba.layers + d.mamba.mtp_layers).find('E') != std::string::npos;
      MEGATRON_CHECK(as_dense(m.mamba.layers) == d.mamba.layers &&
                         as_dense(m.mamba.mtp_layers) == d.mamba.mtp_layers && !dense_has_e,
                     "--moe-use-upcycling: the hybrid pattern '", m.mamba.layers,
                     (m.mamba.mtp_layers.empty() ? "" : "' with MTP layers '" + m.mamba.mtp_layers),
                     "' must be the dense checkpoint's '", d.mamba.layers,
                     (d.mamba.mtp_layers.empty() ? "" : "' with MTP layers '" + d.mamba.mtp_layers),
                     "' (", run.load,
                     ") with E where that has - (an MoE layer in place of each MLP layer to "
                     "upcycle)");
      for (const char* key : {"hybrid_layers", "hybrid_override_pattern", "hybrid_mtp_layers"}) {
        dj.erase(key);
        mj.erase(key);
      }
    }
    const std::vector<std::string> diff = model_arg_differences(dj, mj);
    std::string text;
    for (const std::string& line : diff) text += "\n  " + line;
    MEGATRON_CHECK(diff.empty(),
                   "--moe-use-upcycling: this run's model differs from the dense "
                   "checkpoint's (",
                   run.load, ") beyond the experts:", text, "\npass the checkpoint's values");
  }
  const MoeConfig& mc = m.moe;
  auto same = [&](const char* flag, int64_t a, int64_t b) {
    MEGATRON_CHECK(a == b, "--moe-use-upcycling: ", flag, " ", b,
                   " differs from the dense "
                   "checkpoint's ",
                   a, " (", run.load, ")");
  };
  same("--num-layers", d.num_layers, m.num_layers);
  same("--hidden-size", d.hidden_size, m.hidden_size);
  same("--num-attention-heads", d.num_attention_heads, m.num_attention_heads);
  same("--num-query-groups", d.num_query_groups, m.num_query_groups);
  same("--kv-channels", d.kv_channels, m.kv_channels);
  same("--vocab-size", d.vocab_size, m.vocab_size);
  MEGATRON_CHECK(
      d.gated_mlp() == m.gated_mlp() && d.squared_relu == m.squared_relu && d.swiglu == m.swiglu,
      "--moe-use-upcycling: the experts' activation (--swiglu, --squared-relu, ...) "
      "must be the dense checkpoint's");
  MEGATRON_CHECK(d.ffn_hidden_size == mc.ffn_hidden_size * g,
                 "--moe-use-upcycling: the dense "
                 "FFN width ",
                 d.ffn_hidden_size, " must be --moe-upcycling-granularity (", g,
                 ") x the experts' width (--moe-ffn-hidden-size, default --ffn-hidden-size: ",
                 mc.ffn_hidden_size, ")");
  MEGATRON_CHECK(mc.num_experts % g == 0, "--num-experts (", mc.num_experts,
                 ") must be divisible by --moe-upcycling-granularity (", g, ")");

  // Megatron's _get_moe_activation_scale and _get_weight_scale.
  const double activation_scale =
      mc.pre_softmax ? static_cast<double>(mc.num_experts * g) / static_cast<double>(mc.router_topk)
                     : static_cast<double>(g);
  const double scale =
      std::pow(activation_scale, m.gated_mlp() || m.squared_relu ? 1.0 / 3.0 : 1.0 / 2.0);
  std::map<std::string, const Param*> by_name;
  for (const Param* p : dense.params->params()) by_name[p->name] = p;
  auto source = [&](const std::string& name) -> const Param& {
    auto it = by_name.find(name);
    MEGATRON_CHECK(it != by_name.end(), "--moe-use-upcycling: the dense checkpoint has no ", name);
    return *it->second;
  };
  const int64_t ffn = mc.ffn_hidden_size, h = m.hidden_size;
  std::vector<std::string> unset;  // MoE tensors nothing of the dense model fills
  for (const Param* p : moe.params->params()) {
    const auto [expert, dense_name] = expert_source(p->name);
    if (expert >= 0) {
      const Param& src = source(dense_name);
      const Tensor full = src.main.to(DType::kF64);  // [f1, h] or [h, f]
      Tensor out = Tensor::empty(p->shape, DType::kF64);
      const int64_t piece = expert % g;
      const double* in = full.data<double>();
      double* o = out.data<double>();
      if (p->name.find("linear_fc1") != std::string::npos) {
        // Rows: piece `piece` of each of the gate's and the up projection's g pieces.
        const int64_t halves = m.gated_mlp() ? 2 : 1, dense_rows = g * ffn;
        for (int64_t half = 0; half < halves; ++half)
          for (int64_t r = 0; r < ffn; ++r)
            for (int64_t c = 0; c < h; ++c)
              o[(half * ffn + r) * h + c] =
                  scale * in[(half * dense_rows + piece * ffn + r) * h + c];
      } else {  // fc2 [h, g ffn]: columns of the piece
        for (int64_t r = 0; r < h; ++r)
          for (int64_t c = 0; c < ffn; ++c)
            o[r * ffn + c] = scale * in[r * g * ffn + piece * ffn + c];
      }
      moe.params->set_main(*p, out);
      continue;
    }
    if (ends_with(p->name, ".mlp.router.weight")) {
      // The first E/g rows of this run's router, each repeated g times.
      const Tensor init = p->main.to(DType::kF64);
      Tensor out = Tensor::empty(p->shape, DType::kF64);
      for (int64_t e = 0; e < mc.num_experts; ++e)
        for (int64_t c = 0; c < h; ++c)
          out.data<double>()[e * h + c] = init.data<double>()[(e / g) * h + c];
      moe.params->set_main(*p, out);
      continue;
    }
    auto it = by_name.find(p->name);
    if (it == by_name.end()) {
      // Shared experts and the router's expert bias keep this run's initialisation (Megatron's
      // too); anything else would be a model the dense one does not hold.
      if (p->name.find(".mlp.shared_experts.") == std::string::npos &&
          !ends_with(p->name, ".mlp.router.expert_bias"))
        unset.push_back(p->name);
      continue;
    }
    MEGATRON_CHECK(it->second->shape == p->shape, "--moe-use-upcycling: ", p->name, " is ",
                   it->second->shape.str(), " in the dense checkpoint, ", p->shape.str(), " here");
    moe.params->set_main(*p, it->second->main);
  }
  MEGATRON_CHECK(unset.empty(), "--moe-use-upcycling: the dense checkpoint (", run.load,
                 ") has no ", unset.front(), unset.size() > 1 ? " (and others)" : "",
                 ": this run's model holds tensors the dense one does not");
  moe.params->sync_compute_from_main();
  // The data position and the FLOPs so far carry over from the dense run (Megatron's upcycling
  // loads them with the dense checkpoint); a release checkpoint has none.
  RunState state;
  state.consumed_train_samples = dense.state.consumed_train_samples;
  state.consumed_valid_samples = dense.state.consumed_valid_samples;
  state.consumed_test_samples = dense.state.consumed_test_samples;
  state.skipped_train_samples = dense.state.skipped_train_samples;
  state.floating_point_operations = dense.state.floating_point_operations;
  state.global_batch_size = dense.state.global_batch_size;
  save_whole_checkpoint(moe, run.save, 1, state);
  log_line("Upcycled checkpoint saved to " + run.save);
}

}  // namespace megatron::cli
