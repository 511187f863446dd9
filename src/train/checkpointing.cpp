// Trainer-side checkpointing: shard entries, loading into this layout, run state, async saves.
#include "train/checkpointing.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "comm/agreement.h"
#include "core/error.h"
#include "core/logging.h"

namespace megatron {

namespace cp = checkpoint;

namespace {

// The fields whose values fix the shapes (or the meaning) of the saved tensors.
const char* const kShapeKeys[] = {"num_layers",
                                  "hidden_size",
                                  "ffn_hidden_size",
                                  "num_attention_heads",
                                  "num_query_groups",
                                  "kv_channels",
                                  "max_position_embeddings",
                                  "position_embedding_type",
                                  "normalization",
                                  "apply_layernorm_1p",
                                  "qk_layernorm",
                                  "qk_l2_norm",
                                  "no_rope_layers",
                                  "multi_latent_attention",
                                  "mtp_num_layers",
                                  "mtp_use_repeated_layer",
                                  "q_lora_rank",
                                  "kv_lora_rank",
                                  "qk_head_dim",
                                  "qk_pos_emb_head_dim",
                                  "v_head_dim",
                                  "swiglu",
                                  "quick_geglu",
                                  "softmax_learnable",
                                  "add_bias_linear",
                                  "add_qkv_bias",
                                  "untie_embeddings_and_output_weights",
                                  "vocab_size",
                                  "num_experts",
                                  "moe_layer_pattern",
                                  "moe_ffn_hidden_size",
                                  "moe_shared_expert_intermediate_size",
                                  "moe_latent_size",
                                  "moe_shared_expert_gate",
                                  "attention_output_gate",
                                  "mup_width_mult",
                                  "mup_embedding_mult",
                                  "mup_output_mult",
                                  "moe_router_enable_expert_bias",
                                  "transformer_block_type",
                                  "decoder_num_layers",
                                  "relative_attention_num_buckets",
                                  "gated_linear_unit",
                                  "bert_binary_head",
                                  "hybrid_layers",
                                  "hybrid_mtp_layers",
                                  "mamba_state_dim",
                                  "mamba_head_dim",
                                  "mamba_num_groups",
                                  "mamba_heads",
                                  "heterogeneous_blocks"};

// The vocabulary's padding rows depend on the tensor-parallel size; the rows that exist in both
// layouts are read, the others are zero.
bool vocab_rows_may_differ(const Param& p) {
  auto ends_with = [&](const std::string& suffix) {
    return p.name.size() >= suffix.size() &&
           p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // T5's head is lm_head.output_layer.
  return p.name == "embedding.word_embeddings.weight" || ends_with("output_layer.weight") ||
         ends_with("output_layer.bias");
}

std::vector<int64_t> shape_vector(const Shape& s) {
  return {s.begin(), s.end()};
}

}  // namespace

nlohmann::json model_args_json(const Arguments& a, const TransformerConfig& cfg) {
  nlohmann::json j = {
      {"model", a.model},
      {"num_layers", cfg.num_layers},
      {"hidden_size", cfg.hidden_size},
      {"ffn_hidden_size", cfg.ffn_hidden_size},
      {"num_attention_heads", cfg.num_attention_heads},
      {"group_query_attention", a.group_query_attention},
      {"num_query_groups", cfg.num_query_groups},
      {"kv_channels", cfg.kv_channels},
      {"max_position_embeddings", cfg.max_position_embeddings},
      {"seq_length", cfg.seq_length},
      {"position_embedding_type", a.position_embedding_type},
      {"rotary_base", cfg.rotary_base},
      {"rotary_percent", cfg.rotary_percent},
      {"rotary_interleaved", cfg.rotary_interleaved},
      // The switch with its factor: a record without it (`megatron convert`'s) would restore
      // the factor and leave the scaling off.
      {"use_rope_scaling", cfg.rope_scaling_factor > 0},
      {"use_rotary_position_embeddings", a.use_rotary_position_embeddings},
      {"rope_scaling_factor", cfg.rope_scaling_factor},
      {"rotary_seq_len_interpolation_factor", cfg.rotary_seq_len_interpolation_factor},
      {"normalization", a.normalization},
      {"norm_epsilon", cfg.norm_epsilon},
      {"apply_layernorm_1p", cfg.layernorm_zero_centered_gamma},
      {"qk_layernorm", cfg.qk_layernorm},
      {"multi_latent_attention", cfg.mla.enabled},
      {"mtp_num_layers", cfg.mtp_num_layers},
      {"mtp_loss_scaling_factor", cfg.mtp_loss_scaling_factor},
      // Compared: whether the depths share one block (with one depth the same tensors).
      {"mtp_use_repeated_layer", cfg.mtp_blocks() < cfg.mtp_num_layers},
      {"mtp_detach_heads", cfg.mtp_detach_heads},
      {"q_lora_rank", cfg.mla.enabled ? cfg.mla.q_lora_rank : 0},
      {"kv_lora_rank", cfg.mla.enabled ? cfg.mla.kv_lora_rank : 0},
      {"qk_head_dim", cfg.mla.enabled ? cfg.mla.qk_head_dim : 0},
      {"qk_pos_emb_head_dim", cfg.mla.enabled ? cfg.mla.qk_pos_emb_head_dim : 0},
      {"v_head_dim", cfg.mla.enabled ? cfg.mla.v_head_dim : 0},
      {"rope_type", cfg.mla.enabled ? (cfg.mla.yarn ? "yarn" : "rope") : "rope"},
      {"rotary_scaling_factor", cfg.mla.rotary_scaling_factor},
      {"mscale", cfg.mla.mscale},
      {"mscale_all_dim", cfg.mla.mscale_all_dim},
      {"squared_relu", cfg.squared_relu},
      {"swiglu", cfg.swiglu},
      {"gated_linear_unit", cfg.gated_gelu},
      {"decoder_num_layers", cfg.decoder_num_layers},
      {"decoder_seq_length", cfg.decoder_seq_length},
      {"relative_attention_num_buckets", cfg.position_embedding == PositionEmbedding::kRelative
                                             ? cfg.relative_attention_num_buckets
                                             : 0},
      {"relative_attention_max_distance", cfg.relative_attention_max_distance},
      {"softmax_scale", cfg.softmax_scale},
      {"openai_gelu", cfg.openai_gelu},
      {"add_bias_linear", cfg.add_bias_linear},
      {"add_qkv_bias", cfg.add_qkv_bias},
      {"untie_embeddings_and_output_weights", cfg.untie_embeddings_and_output_weights},
      {"vocab_size", cfg.vocab_size},
      {"make_vocab_size_divisible_by", a.make_vocab_size_divisible_by},
      {"num_experts", cfg.moe.num_experts},
      {"moe_layer_pattern", cfg.moe.layer_pattern},
      {"moe_ffn_hidden_size", cfg.moe.ffn_hidden_size},
      {"moe_shared_expert_intermediate_size", cfg.moe.shared_expert_intermediate_size},
      {"moe_latent_size", cfg.moe.latent_size},
      {"moe_shared_expert_gate", cfg.moe.shared_expert_gate},
      {"attention_output_gate", cfg.attention_output_gate},
      // --use-mup's multipliers (0 without it: a checkpoint from before them reads as none).
      {"mup_width_mult", cfg.mup.enabled ? nlohmann::json(cfg.mup.width_mult) : nlohmann::json(0)},
      {"mup_embedding_mult",
       cfg.mup.enabled ? nlohmann::json(cfg.mup.embedding_mult) : nlohmann::json(0)},
      {"mup_output_mult",
       cfg.mup.enabled ? nlohmann::json(cfg.mup.output_mult) : nlohmann::json(0)},
      {"moe_router_enable_expert_bias", cfg.moe.enable_expert_bias},
      {"tokenizer_type", a.tokenizer_type},
      {"transformer_block_type", a.transformer_block_type},
      {"bert_binary_head", cfg.bert_binary_head}};
  // Llama 4's attention variants: the flags' dests (restored by --use-checkpoint-args from a
  // checkpoint without the full argument record) and the resolved NoPE layers (compared).
  j["qk_l2_norm"] = cfg.qk_l2_norm;
  // gpt-oss's pieces under their flags' dests (restored by --use-checkpoint-args); whether the
  // sinks are parameters is compared.
  j["window_size"] = a.window_size;
  j["window_attn_skip_freq"] = a.window_attn_skip_freq;
  j["softmax_type"] = a.softmax_type;
  j["softmax_learnable"] = cfg.softmax_type == SoftmaxType::kLearnable;
  j["quick_geglu"] = cfg.quick_geglu;
  j["glu_linear_offset"] = cfg.glu_linear_offset;
  if (cfg.activation_clamp > 0) j["activation_func_clamp_value"] = cfg.activation_clamp;
  if (cfg.position_embedding == PositionEmbedding::kYarn) {
    j["yarn_original_max_position_embeddings"] = cfg.yarn_original_max_positions;
    j["yarn_beta_fast"] = cfg.yarn_beta_fast;
    j["yarn_beta_slow"] = cfg.yarn_beta_slow;
    j["yarn_correction_range_round_to_int"] = cfg.yarn_round_to_int;
  }
  j["no_rope_freq"] = a.no_rope_freq;
  j["no_rope_layers"] = cfg.no_rope_layers;
  if (a.padded_vocab_size > 0) j["padded_vocab_size"] = a.padded_vocab_size;
  // Hybrid Mamba models: the resolved layer types and the mixers' sizes (compared), and the
  // pattern under its flag's dest (restored by --use-checkpoint-args).
  const MambaConfig& mb = cfg.mamba;
  j["hybrid_layers"] = mb.layers;
  j["hybrid_mtp_layers"] = mb.mtp_layers;
  if (mb.enabled()) {
    // The unified form (the deprecated dest takes it too): the MTP depths after '/'.
    std::string pattern = mb.layers;
    for (int64_t k = 0; k < cfg.mtp_num_layers && !mb.mtp_layers.empty(); ++k)
      pattern += "/" + mb.mtp_layers;
    j["hybrid_override_pattern"] = pattern;
  }
  j["mamba_state_dim"] = mb.has_mamba() ? mb.state_dim : 0;
  j["mamba_head_dim"] = mb.has_mamba() ? mb.head_dim : 0;
  j["mamba_num_groups"] = mb.has_mamba() ? mb.num_groups : 0;
  j["mamba_heads"] = mb.has_mamba() ? mb.heads(cfg.hidden_size) : 0;
  j["mamba_num_heads"] = mb.num_heads;
  // Heterogeneous layers: each layer's [attention, query groups, MLP, MLP width] (compared; 0
  // for the model's size, kinds 0 whole, 1 linear, 2 no-op) and the config.json text under its
  // flag's dest (restored by --use-checkpoint-args, as Megatron keeps it in its args).
  nlohmann::json blocks = nlohmann::json::array();
  for (const HeterogeneousBlock& b : cfg.heterogeneous.blocks)
    blocks.push_back({static_cast<int>(b.attention), b.num_query_groups, static_cast<int>(b.mlp),
                      b.ffn_hidden_size});
  j["heterogeneous_blocks"] = blocks;
  if (cfg.heterogeneous.enabled())
    j["heterogeneous_layers_config_encoded_json"] = cfg.heterogeneous.json;
  // The routing, under the flags' dests, so that a checkpoint without the full argument record
  // (`megatron convert`'s) restores it with --use-checkpoint-args.
  if (cfg.moe.enabled()) {
    const MoeConfig& m = cfg.moe;
    j["moe_router_topk"] = m.router_topk;
    j["moe_router_pre_softmax"] = m.pre_softmax;
    j["moe_router_score_function"] =
        m.score_function == MoeScoreFunction::kSigmoid ? "sigmoid" : "softmax";
    j["moe_router_num_groups"] = m.num_groups;
    j["moe_router_group_topk"] = m.group_topk;
    if (m.topk_scaling_factor > 0) j["moe_router_topk_scaling_factor"] = m.topk_scaling_factor;
    j["moe_layer_freq"] = a.moe_layer_freq;
    j["moe_apply_probs_on_input"] = m.apply_probs_on_input;
  }
  return j;
}

nlohmann::json model_record_as_flags(nlohmann::json args) {
  if (args.contains("add_bias_linear") && args["add_bias_linear"].is_boolean())
    args["disable_bias_linear"] = !args["add_bias_linear"].get<bool>();
  if (!args.contains("use_rope_scaling") && args.contains("rope_scaling_factor") &&
      args["rope_scaling_factor"].is_number() && args["rope_scaling_factor"].get<double>() > 0)
    args["use_rope_scaling"] = true;
  // --use-mup's multipliers are recorded as 0 without it: not flags to restore then; with it, the
  // flags that give them back (the base width from the width multiplier).
  const nlohmann::json width = args.value("mup_width_mult", nlohmann::json());
  if (width.is_number() && width.get<double>() > 0) {
    args["use_mup"] = true;
    if (args.contains("hidden_size") && args["hidden_size"].is_number_integer()) {
      args["mup_base_hidden_size"] = static_cast<int64_t>(std::llround(
          static_cast<double>(args["hidden_size"].get<int64_t>()) / width.get<double>()));
    }
  } else {
    for (const char* key : {"mup_width_mult", "mup_embedding_mult", "mup_output_mult"})
      args.erase(key);
  }
  return args;
}

std::vector<std::string> model_arg_differences(const nlohmann::json& saved,
                                               const nlohmann::json& mine) {
  std::vector<std::string> out;
  for (const char* key : kShapeKeys) {
    const nlohmann::json s = saved.value(key, nlohmann::json());
    const nlohmann::json m = mine.value(key, nlohmann::json());
    // A model flag newer than the checkpoint: absent means its default (off, 0, none).
    const bool default_value =
        (m.is_boolean() && !m.get<bool>()) || (m.is_number_integer() && m.get<int64_t>() == 0) ||
        (m.is_array() && m.empty()) || (m.is_string() && m.get<std::string>().empty());
    if (s.is_null() && default_value) continue;
    if (s != m)
      out.push_back(std::string(key) + ": checkpoint " + s.dump() + ", this run " + m.dump());
  }
  return out;
}

namespace {

// The distributed-optimizer instance holding p's shards on this rank.
int64_t instance_of(const CheckpointTarget& t, const Param& p) {
  return p.expert_parallel ? t.expert_instance : t.instance;
}

// Calls fn(tensor name, param, flat buffer, where the Param's element 0 sits in it, piece) for
// every box of what `t` holds: the main weights and plain-Adam moments of every Param, and the
// distributed optimizer's owned moments. writes_only: only the boxes this rank writes (each
// element once over all ranks, see the file comment); else every box it holds (a load).
template <typename Fn>
void for_each_box(const CheckpointTarget& t, bool optim, bool writes_only, Fn&& fn) {
  ParamSet& ps = *t.params;
  // Sharded main weights (Megatron-FSDP): each rank holds, writes and reads only its shards of
  // them (the owned segments, below); frozen Params keep whole private copies then, written by
  // data-parallel rank 0 like unsharded weights.
  const bool sharded = ps.main_sharded();
  for (const Param* p : ps.params()) {
    const bool weights = !writes_only || (p->expert_parallel ? t.expert_dp_rank : t.dp_rank) == 0;
    if ((sharded && !p->frozen) || (writes_only && p->is_duplicate())) continue;
    // p's optimizer state: held by every replica and written with the weights, or under Muon's
    // layer-wise distribution held and written by p's owner alone (AdamW::state_offset).
    const bool by_owner = t.optimizer && t.optimizer->states_by_owner() && !p->frozen;
    const bool state = optim && t.optimizer && p->requires_grad && (weights || by_owner);
    if (!weights && !state) continue;
    const bool own = sharded && p->frozen;
    Tensor& flat = own ? const_cast<Tensor&>(p->main) : ps.main();
    const int64_t at = own ? 0 : ps.offset_of(*p);
    for (const cp::Piece& piece : cp::shard_pieces(*p, 0, p->shape.numel())) {
      if (weights) fn("model." + p->name, *p, flat, at, piece);
      if (!state) continue;
      const AdamWConfig& c = t.optimizer->config();
      for (int k = 0; k < states_of(c, *p); ++k) {
        const int64_t st = t.optimizer->state_offset(*p, k);
        if (st < 0) continue;  // another rank's (layer-wise)
        if (k == 0)
          fn(std::string("optimizer.") + first_state_name(c, *p) + "." + p->name, *p,
             t.optimizer->exp_avg(), st, piece);
        else
          fn("optimizer.exp_avg_sq." + p->name, *p, t.optimizer->exp_avg_sq(), st, piece);
      }
    }
  }
  for (const Param* p : t.extra_state) {
    const int64_t writer = p->expert_parallel ? t.expert_dp_rank : t.dp_rank;
    if (writes_only && (writer != 0 || p->is_duplicate())) continue;
    for (const cp::Piece& piece : cp::shard_pieces(*p, 0, p->shape.numel()))
      fn("model." + p->name, *p, const_cast<Tensor&>(p->main), 0, piece);
  }
  if (sharded) {
    for (const ParamSet::OwnedSegment& seg : ps.owned_segments()) {
      if ((writes_only && (seg.param->is_duplicate() || instance_of(t, *seg.param) != 0)) ||
          seg.param->frozen)
        continue;
      const int64_t at = seg.at - seg.param_begin;
      for (const cp::Piece& piece : cp::shard_pieces(*seg.param, seg.param_begin, seg.numel))
        fn("model." + seg.param->name, *seg.param, ps.main(), at, piece);
    }
  }
  if (!optim || !t.dist_optimizer) return;
  // The moments in fp32 whatever their storage (the precision-aware optimizer's bf16, fp16 or fp8
  // moments are saved unscaled, as Megatron saves them), stored back after a load.
  auto [exp_avg, exp_avg_sq] = t.dist_optimizer->moments_f32();
  const AdamWConfig& c = t.dist_optimizer->config();
  const std::string first = std::string("optimizer.") + first_state_name(c) + ".";
  for (const auto& seg : t.dist_optimizer->owned_segments()) {
    if (writes_only && (seg.param->is_duplicate() || instance_of(t, *seg.param) != 0)) continue;
    // The segment's moments start at seg.state for the Param's element seg.param_begin.
    const int64_t at = seg.state - seg.param_begin;
    for (const cp::Piece& piece : cp::shard_pieces(*seg.param, seg.param_begin, seg.numel)) {
      if (c.states() >= 1) fn(first + seg.param->name, *seg.param, exp_avg, at, piece);
      if (c.states() >= 2)
        fn("optimizer.exp_avg_sq." + seg.param->name, *seg.param, exp_avg_sq, at, piece);
    }
  }
  if (!writes_only) t.dist_optimizer->set_moments(exp_avg, exp_avg_sq);
}

}  // namespace

std::vector<cp::ShardEntry> shard_entries(const CheckpointTarget& t, bool optim, bool copy) {
  std::vector<cp::ShardEntry> out;
  for_each_box(t, optim, /*writes_only=*/true,
               [&](const std::string& name, const Param& p, Tensor& flat, int64_t at,
                   const cp::Piece& piece) {
                 Tensor view = flat.flat_view(at + piece.local_begin, Shape{piece.global.numel()});
                 // The writers read host memory: a GPU's weights are copied out.
                 const bool host = is_host_memory(view.device());
                 out.push_back({name, shape_vector(p.full_shape()), piece.global,
                                !host  ? view.to(Device::kCPU)
                                : copy ? view.clone()
                                       : view});
               });
  return out;
}

namespace {
// Reads one box of `name` into its elements of flat (through the host where flat is on a GPU).
void read_box(cp::CheckpointReader& reader, const std::string& name, const cp::Piece& piece,
              Tensor& flat, int64_t at, bool vocab_rows_differ) {
  Tensor view = flat.flat_view(at + piece.local_begin, Shape{piece.global.numel()});
  Tensor host = to_host(view);
  reader.read(name, piece.global, host.data<float>(), vocab_rows_differ);
  if (host.raw() != view.raw()) view.copy_from(host);
}
}  // namespace

namespace {
bool is_extra_state(const CheckpointTarget& t, const Param& p) {
  return std::find(t.extra_state.begin(), t.extra_state.end(), &p) != t.extra_state.end();
}
}  // namespace

namespace {
std::vector<std::string> take_optimizer_groups(Arguments& args) {
  std::vector<std::string> changes;
  if (args.load.empty() || !args.load_optim || args.finetune) return changes;
  std::vector<std::string> notes;  // the load logs them
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(args, &notes);
  if (!choice) return changes;
  const std::string dir = cp::iteration_dir(choice->root, choice->iteration);
  std::ifstream file(dir + "/" + cp::kMetadataFile);
  if (!file) return changes;
  const nlohmann::json meta = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || meta.value("release", false) ||
      !meta.value("has_optimizer_state", false))
    return changes;
  const std::string saved = optimizer_state_family(meta.value("optimizer", std::string("adam")));
  if (saved != optimizer_state_family(args.optimizer)) return changes;  // the load refuses it
  auto take = [&](const char* key, const char* flag, double& value) {
    const auto it = meta.find(key);
    if (it == meta.end() || !it->is_number() || it->get<double>() == value) return;
    changes.push_back(
        strprintf(" > %s %g from checkpoint %s (this run's flag says %g): Megatron restores the "
                  "optimizer's parameter groups with its state; --no-load-optim keeps the flag",
                  flag, it->get<double>(), dir.c_str(), value));
    value = it->get<double>();
  };
  // Muon's matrices keep their momentum in their group; its other groups are Adam's or Lion's
  // (the load refuses a checkpoint of the other one).
  // (--optimizer lion's groups are all Adam's betas: Megatron builds its Lion from them.)
  const bool lion =
      saved == "muon" && meta.value("muon_scalar_optimizer", std::string("adam")) == "lion";
  if (saved == "muon") take("muon_momentum", "--muon-momentum", args.muon_momentum);
  if (saved == "sgd") {
    take("sgd_momentum", "--sgd-momentum", args.sgd_momentum);
  } else if (lion) {
    take("lion_beta1", "--lion-beta1", args.lion_beta1);
    take("lion_beta2", "--lion-beta2", args.lion_beta2);
  } else {
    take("adam_beta1", "--adam-beta1", args.adam_beta1);
    take("adam_beta2", "--adam-beta2", args.adam_beta2);
    take("adam_eps", "--adam-eps", args.adam_eps);
  }
  return changes;
}
}  // namespace

std::vector<std::string> restore_optimizer_groups(Arguments& args) {
  // Runs outside any agreed section: a bad tracker or metadata file throws here on some ranks
  // only, so it is left to the load, which agrees on the failure and names the file. (Every read
  // that can throw comes before the first flag is set.)
  try {
    return take_optimizer_groups(args);
  } catch (const std::exception&) {
    return {};
  }
}

void load_shards(cp::CheckpointReader& reader, const CheckpointTarget& t, bool optim,
                 bool* extra_missing_out) {
  bool extra_missing = false;
  for_each_box(t, optim, /*writes_only=*/false,
               [&](const std::string& name, const Param& p, Tensor& flat, int64_t at,
                   const cp::Piece& piece) {
                 // Extra state a checkpoint may lack (saved without FP8): kept as it is.
                 if (is_extra_state(t, p) && !reader.has(name)) {
                   extra_missing = true;
                   return;
                 }
                 read_box(reader, name, piece, flat, at, vocab_rows_may_differ(p));
               });
  if (extra_missing_out) *extra_missing_out = extra_missing;
  t.params->sync_compute_from_main();
}

std::vector<std::string> load_weights_present(cp::CheckpointReader& reader,
                                              const CheckpointTarget& t) {
  std::vector<std::string> missing;
  for_each_box(t, /*optim=*/false, /*writes_only=*/false,
               [&](const std::string& name, const Param& p, Tensor& flat, int64_t at,
                   const cp::Piece& piece) {
                 if (!reader.has(name)) {
                   if (is_extra_state(t, p)) return;  // FP8 state starts afresh
                   if (missing.empty() || missing.back() != p.name) missing.push_back(p.name);
                   return;
                 }
                 read_box(reader, name, piece, flat, at, vocab_rows_may_differ(p));
               });
  t.params->sync_compute_from_main();
  return missing;
}

nlohmann::json run_state_json(const RunState& s) {
  nlohmann::json j = {{"consumed_train_samples", s.consumed_train_samples},
                      {"consumed_valid_samples", s.consumed_valid_samples},
                      {"consumed_test_samples", s.consumed_test_samples},
                      {"scheduler_samples", s.scheduler_samples},
                      {"optimizer_steps", s.optimizer_steps},
                      {"skipped_train_samples", s.skipped_train_samples},
                      {"floating_point_operations", s.floating_point_operations}};
  if (s.global_batch_size) j["global_batch_size"] = *s.global_batch_size;
  j["loss_scaler"] = nullptr;
  if (s.loss_scaler) {
    j["loss_scaler"] = {{"scale", s.loss_scaler->scale},
                        {"growth_tracker", s.loss_scaler->growth_tracker},
                        {"hysteresis_tracker", s.loss_scaler->hysteresis_tracker}};
  }
  j["rng"] = nullptr;
  if (s.rng_seed) j["rng"] = {{"seed", *s.rng_seed}};
  j["opt_param_scheduler"] = s.opt_param_scheduler;
  return j;
}

RunState run_state_from_json(const nlohmann::json& meta, const std::string& where) {
  RunState s;
  try {
    s.iteration = meta.at("iteration").get<int64_t>();
    const nlohmann::json& j = meta.at("run_state");
    s.consumed_train_samples = j.at("consumed_train_samples").get<int64_t>();
    s.consumed_valid_samples = j.at("consumed_valid_samples").get<int64_t>();
    s.consumed_test_samples = j.at("consumed_test_samples").get<int64_t>();
    s.scheduler_samples = j.at("scheduler_samples").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.skipped_train_samples = j.value("skipped_train_samples", int64_t{0});
    s.floating_point_operations = j.value("floating_point_operations", 0.0);
    if (j.contains("global_batch_size"))  // (older checkpoints did not record it)
      s.global_batch_size = j.at("global_batch_size").get<int64_t>();
    if (!j.at("loss_scaler").is_null()) {
      const nlohmann::json& l = j.at("loss_scaler");
      s.loss_scaler =
          LossScalerState{l.at("scale").get<double>(), l.at("growth_tracker").get<int64_t>(),
                          l.at("hysteresis_tracker").get<int64_t>()};
    }
    if (!j.at("rng").is_null()) s.rng_seed = j.at("rng").at("seed").get<uint64_t>();
    s.opt_param_scheduler = j.value("opt_param_scheduler", nlohmann::json());
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, where, ": the run state is incomplete (", e.what(), ")");
  }
  return s;
}

std::string non_persistent_dir(const Arguments& args, const std::string& root) {
  return args.non_persistent_global_ckpt_dir.empty() ? root + "/non_persistent"
                                                     : args.non_persistent_global_ckpt_dir;
}

std::optional<CheckpointChoice> checkpoint_to_load(const Arguments& args,
                                                   std::vector<std::string>* notes) {
  std::optional<int64_t> iteration =
      args.ckpt_step >= 0 ? std::optional<int64_t>(args.ckpt_step) : cp::read_tracker(args.load);
  if (args.non_persistent_ckpt_type == "global") {
    const std::string np = non_persistent_dir(args, args.load);
    const std::optional<int64_t> np_iteration = cp::read_tracker(np);
    if (!np_iteration) {
      notes->push_back("WARNING: no non-persistent checkpoint under " + np + " (no " +
                       cp::kTrackerFile + ")");
    } else if (!iteration || *np_iteration >= *iteration) {
      return CheckpointChoice{np, *np_iteration, true};
    } else {
      notes->push_back(strprintf(
          "WARNING: the non-persistent checkpoint (iteration %ld) is older than the persistent "
          "one (iteration %ld): loading the persistent one",
          static_cast<long>(*np_iteration), static_cast<long>(*iteration)));
    }
  }
  if (!iteration) return std::nullopt;
  return CheckpointChoice{args.load, *iteration, false};
}

Checkpointer::Checkpointer(std::shared_ptr<ParallelState> parallel, const Arguments& args,
                           CheckpointTarget target, FaultInjection fault, Kind kind)
    : parallel_(std::move(parallel)),
      root_(kind == Kind::kPersistent ? args.save : non_persistent_dir(args, args.save)),
      kind_(kind),
      async_(args.async_save),
      save_optim_(args.save_optim),
      retain_interval_(kind == Kind::kPersistent ? args.save_retain_interval : 0),
      target_(target),
      fault_(fault) {}

void Checkpointer::delete_older_non_persistent() const {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> committed;  // iter_NNNNNNN directories
  for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= 5 || name.compare(0, 5, "iter_") != 0) continue;
    const std::string digits = name.substr(5);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;  // staging
    committed.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(committed.begin(), committed.end());
  for (size_t i = 0; i + 1 < committed.size(); ++i) {
    const auto& [iteration, path] = committed[i];
    if (fs::remove_all(path, ec); ec) {
      log_line(
          strprintf("  encountered exception \"%s\" when trying to delete the "
                    "non-persistent checkpoint %s",
                    ec.message().c_str(), path.c_str()));
    } else {
      log_line(strprintf("  deleted the non-persistent checkpoint of iteration %ld (%s)",
                         static_cast<long>(iteration), path.c_str()));
    }
  }
}

Checkpointer::~Checkpointer() {
  // An unfinished save is abandoned (the job is failing): its staging directory never commits.
  if (in_flight_ && in_flight_->writer.joinable()) in_flight_->writer.join();
}

std::function<bool()> Checkpointer::fault_hook(int64_t iteration) const {
  if (parallel_->rank() != fault_.rank || iteration != fault_.iteration) return {};
  if (fault_.kind == FaultInjection::Kind::kKillInSave) {
    return [] {
      std::raise(SIGKILL);
      return false;
    };
  }
  if (fault_.kind == FaultInjection::Kind::kFailInSave) {
    return [rank = fault_.rank] {
      log_error(
          strprintf("[rank %d] injected fault (--inject-fault fail-in-save): the "
                    "checkpoint write fails as on a full disk",
                    rank));
      errno = ENOSPC;
      return false;
    };
  }
  return {};
}

void Checkpointer::save(const RunState& state, const nlohmann::json& extra) {
  finish();
  const ParallelState& ps = *parallel_;
  if (ps.rank() == 0) {
    // Before the new one is written: the newest committed one stays until it is.
    if (kind_ == Kind::kNonPersistent) delete_older_non_persistent();
    log_line(strprintf("saving %scheckpoint at iteration %7ld to %s in torch_dist format",
                       kind_ == Kind::kNonPersistent ? "non-persistent " : "",
                       static_cast<long>(state.iteration), root_.c_str()));
  }
  auto f = std::make_unique<InFlight>();
  f->iteration = state.iteration;
  f->meta = extra;
  f->meta["run_state"] = run_state_json(state);
  f->staging = cp::prepare_save(ps.world_group(), root_, state.iteration);
  f->entries = shard_entries(target_, save_optim_, /*copy=*/async_);
  last_saved_ = state.iteration;
  auto write = [f = f.get(), rank = ps.rank(), hook = fault_hook(state.iteration)] {
    try {
      f->record = cp::write_rank_file(f->staging, rank, f->entries, hook);
    } catch (const std::exception& e) {
      f->error = e.what();
    }
    f->entries.clear();  // the host copies are no longer needed
    f->done = true;
  };
  if (!async_) {
    write();
    commit(*f);
    return;
  }
  f->blocking_seconds = f->since_start.elapsed();
  f->writer = std::thread(write);
  in_flight_ = std::move(f);
}

void Checkpointer::poll() {
  if (!in_flight_) return;
  Tensor all_done = Tensor::empty({1}, DType::kI64);
  all_done.data<int64_t>()[0] = in_flight_->done ? 0 : 1;
  parallel_->world_group().all_reduce(all_done, ReduceOp::kMax);
  if (all_done.data<int64_t>()[0] == 0) finish();
}

void Checkpointer::finish() {
  if (!in_flight_) return;
  std::unique_ptr<InFlight> f = std::move(in_flight_);
  f->writer.join();
  commit(*f);
}

void Checkpointer::commit(InFlight& f) {
  // The checkpoint the tracker names until this one commits (--save-retain-interval).
  int64_t previous = 0;  // 0: none to consider
  if (retain_interval_ > 0 && parallel_->rank() == 0)
    previous = cp::read_tracker(root_).value_or(0);
  int64_t bytes = 0;
  try {
    bytes = cp::commit_save(parallel_->world_group(), root_, f.iteration, f.staging, f.record,
                            f.error, f.meta);
  } catch (const AgreedFailure& e) {
    throw AgreedFailure(strprintf("saving the checkpoint of iteration %ld failed, so it was "
                                  "discarded (the previous checkpoint and the tracker are "
                                  "untouched): %s",
                                  static_cast<long>(f.iteration), e.what()),
                        1, e.failing_rank());
  }
  const ParallelState& ps = *parallel_;
  if (ps.rank() == 0) {
    log_line(
        strprintf("  successfully saved checkpoint from iteration %7ld to %s [ t %d/%d, p "
                  "%d/%d ]",
                  static_cast<long>(f.iteration), root_.c_str(), ps.tp_rank() + 1, ps.tp_size(),
                  ps.pp_rank() + 1, ps.pp_size()));
    const double seconds = f.since_start.elapsed();
    const double mb = static_cast<double>(bytes) / 1e6;
    std::string line = strprintf(
        " > checkpoint of iteration %ld: %.1f MB in %d files, %.3f s "
        "(%.1f MB/s)",
        static_cast<long>(f.iteration), mb, ps.world_size(), seconds, mb / std::max(seconds, 1e-9));
    if (async_) {
      line += strprintf("; training waited %.3f s for the host copy", f.blocking_seconds);
    }
    log_line(line);
    if (async_ && progress_) progress_->committed_async(f.iteration);
    // Megatron keeps the multiples of the retain interval and the latest: the checkpoint the
    // tracker pointed to before is deleted unless it is one of them. A failed deletion is
    // reported and training goes on.
    if (previous > 0 && previous != f.iteration && previous % retain_interval_ != 0) {
      const std::string dir = cp::iteration_dir(root_, previous);
      std::error_code ec;
      if (std::filesystem::is_symlink(dir, ec)) {
        log_line(
            strprintf("  skipping deleting checkpoint from iteration %7ld at %s since it is "
                      "a symbolic link",
                      static_cast<long>(previous), root_.c_str()));
      } else if (std::filesystem::remove_all(dir, ec); ec) {
        log_line(
            strprintf("  encountered exception \"%s\" when trying to delete checkpoint from "
                      "iteration %7ld at %s",
                      ec.message().c_str(), static_cast<long>(previous), root_.c_str()));
      } else {
        log_line(strprintf("  successfully deleted checkpoint from iteration %7ld at %s",
                           static_cast<long>(previous), root_.c_str()));
        if (progress_) progress_->deleted_checkpoint(previous);
      }
    }
  }
}

}  // namespace megatron
