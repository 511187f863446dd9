// Megatron's flag semantics for the model shape: defaults (SwiGLU's ffn size), the padded
// vocabulary, --group-query-attention; validation is TransformerConfig::finalize.
#include "train/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "transformer/layer_pattern.h"
#include "transformer/mamba/hybrid_pattern.h"

namespace megatron {

std::string hybrid_pattern_text(const Arguments& a) {
  const std::string& given =
      a.hybrid_layer_pattern.empty() ? a.hybrid_override_pattern : a.hybrid_layer_pattern;
  return with_legacy_mtp_pattern(given, a.mtp_hybrid_override_pattern, a.mtp_num_layers);
}

std::string hybrid_pattern_flag(const Arguments& a) {
  return a.hybrid_layer_pattern.empty() && !a.hybrid_override_pattern.empty()
             ? "--hybrid-override-pattern"
             : "--hybrid-layer-pattern";
}

MoeConfig moe_config_from_args(const Arguments& a) {
  MoeConfig m;
  m.num_experts = a.num_experts;
  if (a.num_experts <= 0) return m;
  m.layer_pattern = parse_moe_layer_freq(a.moe_layer_freq, a.num_layers);
  m.ffn_hidden_size = a.moe_ffn_hidden_size;
  m.shared_expert_intermediate_size = a.moe_shared_expert_intermediate_size;
  m.shared_expert_overlap = a.moe_shared_expert_overlap;
  // Megatron reads the flag only with shared experts.
  m.shared_expert_gate = a.moe_shared_expert_gate && a.moe_shared_expert_intermediate_size > 0;
  m.latent_size = a.moe_latent_size;
  m.router_topk = a.moe_router_topk;
  if (a.moe_router_score_function == "softmax") {
    m.score_function = MoeScoreFunction::kSoftmax;
  } else if (a.moe_router_score_function == "sigmoid") {
    m.score_function = MoeScoreFunction::kSigmoid;
  } else {
    MEGATRON_CHECK(false, "--moe-router-score-function: unknown '", a.moe_router_score_function,
                   "'; choose softmax or sigmoid");
  }
  m.pre_softmax = a.moe_router_pre_softmax;
  m.topk_scaling_factor =
      is_set(a.moe_router_topk_scaling_factor) ? a.moe_router_topk_scaling_factor : 0.0;
  m.num_groups = a.moe_router_num_groups;
  m.group_topk = a.moe_router_group_topk;
  m.enable_expert_bias = a.moe_router_enable_expert_bias;
  m.bias_update_rate = a.moe_router_bias_update_rate;
  m.router_dtype = a.moe_router_dtype;
  m.load_balancing.clear();
  for (const std::string& t : a.moe_router_load_balancing_type)
    m.load_balancing.push_back(parse_moe_load_balancing(t));
  m.aux_loss_coeff.clear();
  for (const std::string& c : a.moe_aux_loss_coeff) {
    try {
      size_t used = 0;
      m.aux_loss_coeff.push_back(std::stod(c, &used));
      MEGATRON_CHECK(used == c.size(), "");
    } catch (const std::exception&) {
      MEGATRON_CHECK(false, "--moe-aux-loss-coeff: '", c, "' is not a number");
    }
  }
  m.z_loss_coeff = is_set(a.moe_z_loss_coeff) ? a.moe_z_loss_coeff : 0.0;
  m.input_jitter_eps = is_set(a.moe_input_jitter_eps) ? a.moe_input_jitter_eps : 0.0;
  m.force_load_balancing = a.moe_router_force_load_balancing;
  m.apply_probs_on_input = a.moe_apply_probs_on_input;
  // Megatron turns a negative capacity factor into None (dropless).
  m.capacity_factor = is_set(a.moe_expert_capacity_factor) && a.moe_expert_capacity_factor > 0
                          ? a.moe_expert_capacity_factor
                          : 0.0;
  if (a.moe_token_drop_policy == "probs") {
    m.drop_policy = MoeDropPolicy::kProbs;
  } else if (a.moe_token_drop_policy == "position") {
    m.drop_policy = MoeDropPolicy::kPosition;
  } else {
    MEGATRON_CHECK(false, "--moe-token-drop-policy: unknown '", a.moe_token_drop_policy,
                   "'; choose probs or position");
  }
  m.pad_expert_input_to_capacity = a.moe_pad_expert_input_to_capacity;
  m.router_padding_for_fp8 = a.moe_router_padding_for_fp8;
  if (a.moe_token_dispatcher_type == "allgather") {
    m.dispatcher = MoeDispatcher::kAllGather;
  } else if (a.moe_token_dispatcher_type == "alltoall") {
    m.dispatcher = MoeDispatcher::kAllToAll;
  } else {
    MEGATRON_CHECK(false, "--moe-token-dispatcher-type: unknown '", a.moe_token_dispatcher_type,
                   "'; choose allgather or alltoall (flex needs DeepEP on GPUs)");
  }
  m.grouped_gemm = a.moe_grouped_gemm;
  m.per_layer_logging = a.moe_per_layer_logging;
  return m;
}

Fp8Config fp8_config_from_args(const Arguments& a) {
  Fp8Config f;
  if (a.fp8_format.empty()) return f;
  f.mode = a.fp8_format == "hybrid" ? Fp8Mode::kHybrid : Fp8Mode::kE4M3;
  f.recipe = a.fp8_recipe == "tensorwise"  ? Fp8Recipe::kTensorwise
             : a.fp8_recipe == "mxfp8"     ? Fp8Recipe::kMxfp8
             : a.fp8_recipe == "blockwise" ? Fp8Recipe::kBlockwise
                                           : Fp8Recipe::kDelayed;
  f.margin = static_cast<int>(a.fp8_margin);
  f.amax_history_len = a.fp8_amax_history_len;
  f.amax_compute_max = a.fp8_amax_compute_algo == "max";
  // Megatron hands fp8_wgrad to DelayedScaling alone (override_linear_precision); the other
  // recipes keep FP8 weight gradients.
  f.wgrad = !a.no_fp8_wgrad || f.recipe != Fp8Recipe::kDelayed;
  f.param_gather = a.fp8_param_gather;
  f.first_last_layers_bf16 = a.first_last_layers_bf16;
  f.num_layers_at_start_in_bf16 = a.num_layers_at_start_in_bf16;
  f.num_layers_at_end_in_bf16 = a.num_layers_at_end_in_bf16;
  return f;
}

namespace {
// Transformer Engine runs a GEMM in FP8 only when its input is [rows, in] with rows % 8 == 0 and
// in % 16 == 0 and its weight [out, in] with out % 8 == 0 (assert_dim_for_fp8_exec); Megatron
// users meet the rule as that assertion. It is kept so that a run configured here also runs on
// a GPU with TE. Sizes are this rank's (TP-split) ones.
void check_fp8_gemm_shapes(const TransformerConfig& c, const Arguments& a) {
  const int64_t tp = a.tensor_model_parallel_size;
  const int64_t cp = std::max<int64_t>(a.context_parallel_size, 1);
  const int64_t rows = a.micro_batch_size * c.seq_length / cp;
  const int64_t hn = c.kv_channels, np = c.num_attention_heads, ng = c.num_query_groups;
  const int64_t fc1_out = c.ffn_hidden_size * (c.gated_mlp() ? 2 : 1);
  struct Gemm {
    const char* name;
    int64_t in, out;
    const char* flags;
  };
  std::vector<Gemm> gemms = {
      {"linear_qkv", c.hidden_size, (np + 2 * ng) * hn / tp,
       "--hidden-size, --num-attention-heads, --num-query-groups, --kv-channels"},
      {"linear_proj", np * hn / tp, c.hidden_size, "--hidden-size, --kv-channels"},
      {"linear_fc1", c.hidden_size, fc1_out / tp, "--hidden-size, --ffn-hidden-size"},
      {"linear_fc2", c.ffn_hidden_size / tp, c.hidden_size, "--ffn-hidden-size"},
  };
  if (c.mla.enabled) {  // MLA's projections instead of linear_qkv
    const MlaConfig& m = c.mla;
    const char* flags =
        "--q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, "
        "--v-head-dim, --num-attention-heads";
    gemms[0] = {"linear_kv_down_proj", c.hidden_size, m.kv_lora_rank + m.qk_pos_emb_head_dim,
                flags};
    gemms[1] = {"linear_proj", np * m.v_head_dim / tp, c.hidden_size, flags};
    gemms.push_back(
        {"linear_kv_up_proj", m.kv_lora_rank, np * (m.qk_head_dim + m.v_head_dim) / tp, flags});
    if (m.q_lora_rank > 0) {
      gemms.push_back({"linear_q_down_proj", c.hidden_size, m.q_lora_rank, flags});
      gemms.push_back({"linear_q_up_proj", m.q_lora_rank, np * m.q_head_dim() / tp, flags});
    } else {
      gemms.push_back({"linear_q_proj", c.hidden_size, np * m.q_head_dim() / tp, flags});
    }
  }
  if (c.mamba.enabled()) {
    // A hybrid model's GEMMs are those of the layer types its pattern has; Megatron's mixer
    // asserts its in-projection's width divisible by 16 under FP8.
    const std::string l = c.mamba.layers + c.mamba.mtp_layers;  // the MTP depths' too
    const bool attention = l.find('*') != std::string::npos, mlp = l.find('-') != std::string::npos;
    std::vector<Gemm> kept;
    for (const Gemm& g : gemms) {
      const bool is_attention =
          std::string(g.name).rfind("linear_qkv", 0) == 0 || std::string(g.name) == "linear_proj";
      if (is_attention ? attention : mlp) kept.push_back(g);
    }
    gemms = kept;
    if (c.mamba.has_mamba()) {
      const MambaConfig& m = c.mamba;
      const char* flags =
          "--hidden-size, --mamba-head-dim, --mamba-num-heads, --mamba-num-groups, "
          "--mamba-state-dim";
      MEGATRON_CHECK(m.in_proj_dim(c.hidden_size) % 16 == 0,
                     "--fp8-format: the Mamba "
                     "in-projection's width 2 d_inner + 2 groups x state + heads = ",
                     m.in_proj_dim(c.hidden_size),
                     " must be a multiple of 16 (Megatron's "
                     "assertion): change ",
                     flags);
      gemms.push_back({"mixer.in_proj", c.hidden_size, m.in_proj_dim(c.hidden_size) / tp, flags});
      gemms.push_back({"mixer.out_proj", m.d_inner(c.hidden_size) / tp, c.hidden_size, flags});
    }
  }
  // A heterogeneous model's layers with their own query groups or MLP width, and its linear
  // replacements ([h, h/tp]).
  for (const HeterogeneousBlock& b : c.heterogeneous.blocks) {
    const char* flag = "--heterogeneous-layers-config-path";
    if (b.num_query_groups > 0)
      gemms.push_back({"linear_qkv", c.hidden_size, (np + 2 * b.num_query_groups) * hn / tp, flag});
    if (b.ffn_hidden_size > 0) {
      gemms.push_back(
          {"linear_fc1", c.hidden_size, b.ffn_hidden_size * (c.gated_mlp() ? 2 : 1) / tp, flag});
      gemms.push_back({"linear_fc2", b.ffn_hidden_size / tp, c.hidden_size, flag});
    }
    if (b.attention == BranchKind::kLinear || b.mlp == BranchKind::kLinear)
      gemms.push_back({"linear replacement", c.hidden_size, c.hidden_size / tp, flag});
  }
  if (c.moe.enabled()) {  // the experts' grouped GEMMs (split over ETP) and the shared experts
    const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
    const int64_t f = c.moe.ffn_hidden_size, s = c.moe.shared_expert_intermediate_size;
    const int64_t g = c.gated_mlp() ? 2 : 1;
    // LatentMoE: the experts run at the latent width, between two replicated projections.
    const int64_t w = c.moe.latent_size > 0 ? c.moe.latent_size : c.hidden_size;
    const char* wflag = c.moe.latent_size > 0 ? "--moe-latent-size" : "--moe-ffn-hidden-size";
    gemms.push_back(
        {"an expert's linear_fc1 (per expert-tensor-parallel rank)", w, g * f / etp, wflag});
    gemms.push_back(
        {"an expert's linear_fc2 (per expert-tensor-parallel rank)", f / etp, w, wflag});
    if (c.moe.latent_size > 0) {
      gemms.push_back({"fc1_latent_proj", c.hidden_size, w, "--moe-latent-size"});
      gemms.push_back({"fc2_latent_proj", w, c.hidden_size, "--moe-latent-size"});
    }
    if (s > 0) {
      gemms.push_back({"shared_experts.linear_fc1", c.hidden_size, g * s / tp,
                       "--moe-shared-expert-intermediate-size"});
      gemms.push_back({"shared_experts.linear_fc2", s / tp, c.hidden_size,
                       "--moe-shared-expert-intermediate-size"});
    }
  }
  if (a.mtp_num_layers > 0) {  // each prediction depth's projection [2h -> h], column parallel
    gemms.push_back({"mtp eh_proj", 2 * c.hidden_size, c.hidden_size / tp, "--hidden-size"});
  }
  if (a.model == "t5") {  // the decoder's cross-attention
    gemms.push_back({"linear_q", c.hidden_size, np * hn / tp, "--hidden-size, --kv-channels"});
    gemms.push_back({"linear_kv", c.hidden_size, 2 * np * hn / tp, "--hidden-size, --kv-channels"});
  }
  // MXFP8 tensors have 32-element blocks both ways: TE's MXFP8Quantizer wants every dimension
  // (rows, input and output features) divisible by 32.
  const bool mx = a.fp8_recipe == "mxfp8";
  const int64_t in_mult = mx ? 32 : 16, out_mult = mx ? 32 : 8, row_mult = mx ? 32 : 8;
  for (const Gemm& g : gemms) {
    MEGATRON_CHECK(g.in % in_mult == 0 && g.out % out_mult == 0, "--fp8-format: the FP8 GEMM of ",
                   g.name, " is [", g.out, ", ", g.in, "] on each of the ", tp,
                   " tensor-parallel ranks; Transformer Engine needs input features divisible "
                   "by ",
                   in_mult, " and output features by ", out_mult, mx ? " (MXFP8)" : "", ": change ",
                   g.flags);
  }
  MEGATRON_CHECK(rows % row_mult == 0,
                 "--fp8-format: FP8 GEMMs need their rows (--micro-batch-size x "
                 "--seq-length / context parallel = ",
                 rows, ") divisible by ", row_mult, " (Transformer Engine's rule",
                 mx ? " for MXFP8" : "", ")");
  if (a.model == "t5" && c.decoder_seq_length > 0) {
    const int64_t dec_rows = a.micro_batch_size * c.decoder_seq_length;
    MEGATRON_CHECK(dec_rows % row_mult == 0,
                   "--fp8-format: FP8 GEMMs need their rows (--micro-batch-size x "
                   "--decoder-seq-length = ",
                   dec_rows, ") divisible by ", row_mult, " (Transformer Engine's rule",
                   mx ? " for MXFP8" : "", ")");
  }
}
}  // namespace

namespace {
// gpt-oss's pieces (Megatron core 0.19): sliding windows, attention sinks, quick GeGLU with its
// offset and clamp, YaRN on ordinary attention.
void set_gpt_oss_fields(const Arguments& a, TransformerConfig& c) {
  if (!a.window_size.empty()) {
    // Megatron's tuple_type: "L,R" (brackets and spaces allowed).
    std::string text;
    for (char ch : a.window_size)
      if (ch != ' ' && ch != '(' && ch != ')' && ch != '[' && ch != ']') text += ch;
    const size_t comma = text.find(',');
    int64_t left = 0, right = 0;
    bool ok = comma != std::string::npos && text.find(',', comma + 1) == std::string::npos;
    try {
      size_t used = 0;
      left = ok ? std::stoll(text.substr(0, comma), &used) : 0;
      ok = ok && used == comma;
      const std::string r = ok ? text.substr(comma + 1) : "";
      right = ok ? std::stoll(r, &used) : 0;
      ok = ok && used == r.size();
    } catch (const std::exception&) {
      ok = false;
    }
    MEGATRON_CHECK(ok, "--window-size '", a.window_size,
                   "': give two integers \"L,R\", e.g. 127,0 (a window of the 127 keys before "
                   "each query and the query's own)");
    MEGATRON_CHECK(left >= -1 && right >= -1, "--window-size ", a.window_size,
                   ": the sizes are >= 0, or -1 for unbounded");
    MEGATRON_CHECK(right == 0 || right == -1, "--window-size ", a.window_size,
                   ": causal attention sees no key after the query; give R = 0 (e.g. ", left,
                   ",0)");
    // (-1, *) is the whole causal context: no window.
    c.window_attention = left >= 0;
    c.window_left = left;
    c.window_right = 0;
  }
  if (!a.window_attn_skip_freq.empty()) {
    if (a.window_size.empty()) {
      std::fprintf(stderr,
                   "WARNING: --window-attn-skip-freq has no effect without --window-size (as in "
                   "Megatron)\n");
    }
    c.window_layers = parse_window_attn_skip_freq(a.window_attn_skip_freq, a.num_layers);
    const LayerFreq f = parse_layer_freq(a.window_attn_skip_freq, a.num_layers,
                                         "--window-attn-skip-freq", "0 (full) or 1 (window)");
    c.window_skip_every = f.pattern.empty() ? f.every : 0;
  }
  c.track_max_logits = a.qk_clip || a.log_max_attention_logit;
  if (a.softmax_type == "vanilla") {
    c.softmax_type = SoftmaxType::kVanilla;
  } else if (a.softmax_type == "off-by-one") {
    c.softmax_type = SoftmaxType::kOffByOne;
  } else if (a.softmax_type == "learnable") {
    c.softmax_type = SoftmaxType::kLearnable;
  } else {
    MEGATRON_CHECK(false, "--softmax-type: unknown '", a.softmax_type,
                   "'; choose vanilla, off-by-one or learnable");
  }
  MEGATRON_CHECK(c.softmax_type == SoftmaxType::kVanilla || a.model != "t5", "--softmax-type ",
                 a.softmax_type, " is not implemented for T5's cross-attention; use vanilla");
  MEGATRON_CHECK(!c.window_attention || a.model == "gpt" || a.model == "mamba",
                 "--window-size: sliding-window attention is implemented for the causal decoders "
                 "(--model gpt and mamba), not --model ",
                 a.model);
  c.quick_geglu = a.quick_geglu;
  MEGATRON_CHECK(!a.quick_geglu || (!a.swiglu && !a.gated_linear_unit && !a.squared_relu),
                 "--quick-geglu is an activation of its own: drop --swiglu, --gated-linear-unit "
                 "and --squared-relu");
  const bool clamp = is_set(a.activation_func_clamp_value);
  MEGATRON_CHECK(a.quick_geglu || (a.glu_linear_offset == 0 && !clamp),
                 "--glu-linear-offset and --activation-func-clamp-value act on --quick-geglu "
                 "(gpt-oss's MLP); add --quick-geglu or drop them");
  MEGATRON_CHECK(!clamp || a.activation_func_clamp_value > 0,
                 "--activation-func-clamp-value must be positive, got ",
                 a.activation_func_clamp_value);
  c.glu_linear_offset = a.glu_linear_offset;
  c.activation_clamp = clamp ? a.activation_func_clamp_value : 0;
  const bool yarn = a.position_embedding_type == "yarn";
  for (const auto& [flag, value] : {std::pair{"--yarn-original-max-position-embeddings",
                                              a.yarn_original_max_position_embeddings},
                                    std::pair{"--yarn-beta-fast", a.yarn_beta_fast},
                                    std::pair{"--yarn-beta-slow", a.yarn_beta_slow}}) {
    MEGATRON_CHECK(!is_set(value) || yarn || a.multi_latent_attention, flag,
                   " applies to --position-embedding-type yarn");
  }
  if (yarn && !a.multi_latent_attention) {
    MEGATRON_CHECK(!a.rotary_interleaved,
                   "--rotary-interleaved does not work with --position-embedding-type yarn (as "
                   "in Megatron, whose YaRN rotates half-split pairs)");
    if (a.rotary_percent != 1.0 || a.use_rope_scaling ||
        is_set(a.rotary_seq_len_interpolation_factor)) {
      std::fprintf(stderr,
                   "WARNING: --rotary-percent, --use-rope-scaling and "
                   "--rotary-seq-len-interpolation-factor have no effect with "
                   "--position-embedding-type yarn (as in Megatron: YaRN turns the whole head)\n");
    }
    MEGATRON_CHECK(a.rotary_scaling_factor >= 1,
                   "--rotary-scaling-factor (YaRN's factor) must "
                   "be >= 1, got ",
                   a.rotary_scaling_factor);
    c.yarn_factor = a.rotary_scaling_factor;
    if (is_set(a.yarn_original_max_position_embeddings))
      c.yarn_original_max_positions = a.yarn_original_max_position_embeddings;
    if (is_set(a.yarn_beta_fast)) c.yarn_beta_fast = a.yarn_beta_fast;
    if (is_set(a.yarn_beta_slow)) c.yarn_beta_slow = a.yarn_beta_slow;
    c.yarn_mscale = a.mscale;
    c.yarn_mscale_all_dim = a.mscale_all_dim;
    c.yarn_round_to_int = a.yarn_correction_range_round_to_int;
  }
}
}  // namespace

TransformerConfig transformer_config_from_args(const Arguments& a) {
  TransformerConfig c;
  c.num_layers = a.num_layers;
  c.hidden_size = a.hidden_size;
  c.ffn_hidden_size = a.ffn_hidden_size;
  c.num_attention_heads = a.num_attention_heads;
  c.num_query_groups = a.group_query_attention ? a.num_query_groups : 0;
  c.kv_channels = a.kv_channels;
  c.seq_length = a.seq_length;
  c.max_position_embeddings = a.max_position_embeddings;
  if (a.position_embedding_type == "learned_absolute") {
    c.position_embedding = PositionEmbedding::kLearnedAbsolute;
  } else if (a.position_embedding_type == "rope") {
    c.position_embedding = PositionEmbedding::kRope;
  } else if (a.position_embedding_type == "yarn") {
    c.position_embedding = PositionEmbedding::kYarn;
  } else if (a.position_embedding_type == "none") {
    c.position_embedding = PositionEmbedding::kNone;
  } else if (a.position_embedding_type == "relative") {
    MEGATRON_CHECK(a.model == "t5",
                   "--position-embedding-type relative is T5's bucketed attention bias; it "
                   "applies to --model t5 (pretrain_t5)");
    c.position_embedding = PositionEmbedding::kRelative;
  } else {
    MEGATRON_CHECK(false, "--position-embedding-type: unknown type '", a.position_embedding_type,
                   "'; choose learned_absolute, rope, yarn, relative (T5) or none");
  }
  c.relative_attention_num_buckets = a.relative_attention_num_buckets;
  c.relative_attention_max_distance = a.relative_attention_max_distance;
  c.softmax_scale = a.softmax_scale;
  if (a.model == "t5") {
    c.decoder_num_layers = a.decoder_num_layers > 0 ? a.decoder_num_layers : a.num_layers;
    c.decoder_seq_length = a.decoder_seq_length;
  }
  c.rotary_base = a.rotary_base;
  c.rotary_percent = a.rotary_percent;
  c.rotary_interleaved = a.rotary_interleaved;
  c.rope_scaling_factor = a.use_rope_scaling ? a.rope_scaling_factor : 0.0;
  c.rotary_seq_len_interpolation_factor =
      is_set(a.rotary_seq_len_interpolation_factor) ? a.rotary_seq_len_interpolation_factor : 0.0;
  if (a.normalization == "LayerNorm") {
    c.normalization = Normalization::kLayerNorm;
  } else if (a.normalization == "RMSNorm") {
    c.normalization = Normalization::kRMSNorm;
  } else {
    MEGATRON_CHECK(false, "--normalization: unknown '", a.normalization,
                   "'; choose LayerNorm or RMSNorm");
  }
  c.norm_epsilon = a.norm_epsilon;
  c.layernorm_zero_centered_gamma = a.apply_layernorm_1p;
  MEGATRON_CHECK(a.transformer_block_type == "pre_ln" || a.transformer_block_type == "post_ln",
                 "--transformer-block-type: unknown '", a.transformer_block_type,
                 "'; choose pre_ln (Megatron's) or post_ln (original BERT)");
  c.post_layernorm = a.transformer_block_type == "post_ln";
  c.bert_binary_head = !a.bert_no_binary_head;
  c.num_classes = a.num_classes;
  c.squared_relu = a.squared_relu;
  c.qk_layernorm = a.qk_layernorm;
  c.attention_output_gate = a.attention_output_gate;
  c.qk_l2_norm = a.qk_l2_norm;
  // Megatron's spec takes L2Norm over the q/k layernorm when both are given.
  if (c.qk_l2_norm) c.qk_layernorm = false;
  if (!a.no_rope_freq.empty()) c.no_rope_layers = parse_no_rope_freq(a.no_rope_freq, a.num_layers);
  set_gpt_oss_fields(a, c);
  MEGATRON_CHECK(a.rope_type.empty() || a.rope_type == "rope" || a.rope_type == "yarn",
                 "--rope-type: unknown '", a.rope_type, "'; choose rope or yarn");
  MEGATRON_CHECK(a.multi_latent_attention || a.rope_type.empty() || a.rope_type == "rope",
                 "--rope-type yarn needs --multi-latent-attention (as in Megatron, other attention "
                 "takes rope only)");
  if (a.model == "mamba") {
    const std::string text = hybrid_pattern_text(a);
    const std::string flag = hybrid_pattern_flag(a);
    const HybridPattern p = parse_hybrid_pattern(text, flag);
    c.mamba.layers = allocate_hybrid_layers(a.num_layers, a.hybrid_attention_ratio,
                                            a.hybrid_mlp_ratio, p.main, flag);
    // The CLI sets --mtp-num-layers from the pattern (resolve_hybrid_pattern); a record that
    // disagrees with its own pattern is refused here.
    MEGATRON_CHECK(p.mtp.empty() || p.mtp_depths == a.mtp_num_layers, flag, " '", text, "' has ",
                   p.mtp_depths, " MTP depths, --mtp-num-layers is ", a.mtp_num_layers);
    c.mamba.mtp_layers = p.mtp;
    c.mamba.state_dim = a.mamba_state_dim;
    c.mamba.head_dim = a.mamba_head_dim;
    c.mamba.num_groups = a.mamba_num_groups;
    c.mamba.num_heads = a.mamba_num_heads;
    c.mamba.validate(a.num_layers, a.hidden_size, a.tensor_model_parallel_size);
  }
  if (!a.heterogeneous_layers_config_encoded_json.empty()) {
    c.heterogeneous = parse_heterogeneous_config(a.heterogeneous_layers_config_encoded_json,
                                                 a.num_attention_heads, a.hidden_size,
                                                 "--heterogeneous-layers-config-encoded-json");
    const int64_t tp = a.tensor_model_parallel_size;
    for (size_t i = 0; i < c.heterogeneous.blocks.size(); ++i) {
      const HeterogeneousBlock& b = c.heterogeneous.blocks[i];
      const char* where = "the heterogeneous block list (--heterogeneous-layers-config-path)";
      MEGATRON_CHECK(b.num_query_groups % tp == 0, where, ": layer ", i, "'s ", b.num_query_groups,
                     " query groups must be divisible by --tensor-model-parallel-size ", tp);
      MEGATRON_CHECK(b.ffn_hidden_size % tp == 0, where, ": layer ", i, "'s MLP width ",
                     b.ffn_hidden_size, " must be divisible by --tensor-model-parallel-size ", tp);
    }
  }
  c.mtp_num_layers = a.mtp_num_layers;
  c.mtp_loss_scaling_factor = a.mtp_loss_scaling_factor;
  c.mtp_use_repeated_layer = a.mtp_use_repeated_layer;
  c.mtp_detach_heads = a.mtp_detach_heads;
  c.mla.enabled = a.multi_latent_attention;
  c.mla.q_lora_rank = a.q_lora_rank;
  c.mla.kv_lora_rank = a.kv_lora_rank;
  c.mla.qk_head_dim = a.qk_head_dim;
  c.mla.qk_pos_emb_head_dim = a.qk_pos_emb_head_dim;
  c.mla.v_head_dim = a.v_head_dim;
  c.mla.yarn = a.rope_type != "rope";
  c.mla.rotary_scaling_factor = a.rotary_scaling_factor;
  c.mla.mscale = a.mscale;
  c.mla.mscale_all_dim = a.mscale_all_dim;
  c.init_method_xavier_uniform = a.init_method_xavier_uniform;
  c.embedding_init_method_std =
      is_set(a.embedding_init_method_std) ? a.embedding_init_method_std : 0;
  c.swiglu = a.swiglu;
  c.gated_gelu = a.gated_linear_unit;
  c.openai_gelu = a.openai_gelu;
  c.add_bias_linear = !a.disable_bias_linear;
  c.add_qkv_bias = a.add_qkv_bias;
  c.untie_embeddings_and_output_weights = a.untie_embeddings_and_output_weights;
  // A classifier has no output layer: nothing shares the word embeddings, so no pipeline stage
  // keeps a tied copy to synchronise.
  if (c.num_classes > 0) c.untie_embeddings_and_output_weights = true;
  c.hidden_dropout = a.hidden_dropout;
  c.attention_dropout = a.attention_dropout;
  c.init_method_std = a.init_method_std;
  if (a.use_mup) {
    // Megatron core 0.19's TransformerConfig.__post_init__: the width multiplier, the output
    // multiplier 1 / width_mult when left at 1, the attention scale from the head dim (unless
    // --softmax-scale gives one; multi-latent attention keeps its own, as Megatron's).
    c.mup.enabled = true;
    const int64_t base = a.mup_base_hidden_size > 0 ? a.mup_base_hidden_size : a.hidden_size;
    c.mup.width_mult = static_cast<double>(a.hidden_size) / static_cast<double>(base);
    c.mup.embedding_mult = a.mup_embedding_mult;
    c.mup.output_mult = a.mup_output_mult == 1.0 && c.mup.width_mult != 1.0 ? 1.0 / c.mup.width_mult
                                                                            : a.mup_output_mult;
    if (a.softmax_scale == 0) {
      const int64_t kv = a.kv_channels > 0 ? a.kv_channels : a.hidden_size / a.num_attention_heads;
      const double base_head_scale = a.mup_base_head_dim > 0 ? std::sqrt(a.mup_base_head_dim) : 1.0;
      c.softmax_scale = base_head_scale / std::pow(static_cast<double>(kv), a.mup_attn_scale_power);
    }
  }
  // The combinations are checked by the CLI (validate_train_args) and by TransformerBlock.
  if (a.recompute_granularity == "full") {
    c.recompute_granularity = RecomputeGranularity::kFull;
  } else if (a.recompute_granularity == "selective" || a.recompute_activations) {
    c.recompute_granularity = RecomputeGranularity::kSelective;
  } else {
    MEGATRON_CHECK(a.recompute_granularity.empty(), "--recompute-granularity: unknown '",
                   a.recompute_granularity, "'; choose full or selective");
  }
  if (a.recompute_method == "uniform") {
    c.recompute_method = RecomputeMethod::kUniform;
  } else if (a.recompute_method == "block") {
    c.recompute_method = RecomputeMethod::kBlock;
  } else {
    MEGATRON_CHECK(a.recompute_method.empty(), "--recompute-method: unknown '", a.recompute_method,
                   "'; choose uniform or block");
  }
  c.recompute_num_layers = a.recompute_num_layers;
  c.distribute_saved_activations = a.distribute_saved_activations;
  if (!a.recompute_modules.empty()) {  // unset: Megatron's default, core_attn alone
    RecomputeModules& m = c.recompute_modules;
    m = RecomputeModules{};
    m.core_attn = false;
    for (const std::string& name : a.recompute_modules) {
      m.core_attn = m.core_attn || name == "core_attn";
      m.mlp = m.mlp || name == "mlp";
      m.moe = m.moe || name == "moe";
      m.shared_experts = m.shared_experts || name == "shared_experts";
      m.moe_act = m.moe_act || name == "moe_act";
      m.mla_up_proj = m.mla_up_proj || name == "mla_up_proj";
      m.layernorm = m.layernorm || name == "layernorm";
    }
  }
  c.moe = moe_config_from_args(a);
  if (c.mamba.enabled()) {
    // A hybrid model's MoE layers are its pattern's E layers (Megatron's MambaStack builds its
    // moe_layer spec there; --moe-layer-freq shapes GPT's TransformerBlock only).
    // The MTP depths' layers count too (their MoE statistics come after the decoder's).
    std::string l = c.mamba.layers;
    for (int64_t k = 0; k < c.mtp_blocks() && !c.mamba.mtp_layers.empty(); ++k)
      l += c.mamba.mtp_layers;
    const bool has_moe = l.find('E') != std::string::npos;
    MEGATRON_CHECK(!has_moe || c.moe.enabled(), "the hybrid pattern '", l,
                   "' has E (Mixture of Experts) layers: set --num-experts (and the other --moe-* "
                   "flags)");
    MEGATRON_CHECK(has_moe || !c.moe.enabled(),
                   "--num-experts with --model mamba: the hybrid "
                   "pattern '",
                   l,
                   "' has no E (Mixture of Experts) layer; put E layers in "
                   "--hybrid-layer-pattern or drop --num-experts");
    MEGATRON_CHECK(!has_moe || a.moe_layer_freq == "1", "--moe-layer-freq ", a.moe_layer_freq,
                   " does not apply to hybrid Mamba models: their MoE layers are the E layers of "
                   "--hybrid-layer-pattern; drop the flag");
    if (has_moe) {
      c.moe.layer_pattern.clear();
      for (char t : l) c.moe.layer_pattern.push_back(t == 'E' ? 1 : 0);
    }
  }
  c.vision = vision_config_from_args(a);
  MEGATRON_CHECK(a.vocab_size > 0, "--vocab-size must be set (positive) for ", a.tokenizer_type,
                 ", got ", a.vocab_size);
  c.vocab_size = a.vocab_size;
  c.padded_vocab_size =
      pad_vocab_size(a.vocab_size, a.make_vocab_size_divisible_by, a.tensor_model_parallel_size);
  if (a.padded_vocab_size > 0) {
    // Megatron takes it as given; a size below the tokenizer's would leave token ids without an
    // embedding row (an out-of-range lookup, or at TP > 1 silently zero), so it is refused.
    MEGATRON_CHECK(a.padded_vocab_size >= a.vocab_size, "--padded-vocab-size ", a.padded_vocab_size,
                   " is smaller than the tokenizer's vocabulary (", a.vocab_size,
                   "): give at least ", a.vocab_size, " or drop the flag");
    MEGATRON_CHECK(a.padded_vocab_size % a.tensor_model_parallel_size == 0, "--padded-vocab-size ",
                   a.padded_vocab_size, " is not divisible by --tensor-model-parallel-size ",
                   a.tensor_model_parallel_size, ": round it up to a multiple");
    c.padded_vocab_size = a.padded_vocab_size;
  }
  c.compute_dtype = a.bf16 ? DType::kBF16 : a.fp16 ? DType::kF16 : DType::kF32;
  if (c.swiglu && a.ffn_hidden_size == 0) {
    // Megatron: SwiGLU keeps the MLP's parameter count with ffn = int(4h * 2/3 / 64) * 64.
    c.ffn_hidden_size =
        static_cast<int64_t>(4.0 * static_cast<double>(c.hidden_size) * 2.0 / 3.0 / 64.0) * 64;
  }
  c.fp8 = fp8_config_from_args(a);
  c.finalize();
  if (c.fp8.enabled()) check_fp8_gemm_shapes(c, a);
  if (a.model == "t5") {
    MEGATRON_CHECK(c.position_embedding != PositionEmbedding::kLearnedAbsolute ||
                       c.decoder_seq_length <= c.max_position_embeddings,
                   "--decoder-seq-length (", c.decoder_seq_length,
                   ") exceeds --max-position-embeddings (", c.max_position_embeddings,
                   "): the shared learned position table has no row for the later decoder "
                   "positions");
  }
  return c;
}

VisionConfig vision_config_from_args(const Arguments& a) {
  VisionConfig v;
  if (a.model != "llava") return v;
  v.model_type = a.vision_model_type;
  v.num_layers = a.vision_num_layers > 0 ? a.vision_num_layers : a.encoder_num_layers;
  v.hidden_size = a.vision_hidden_size;
  v.num_attention_heads = a.vision_num_attention_heads;
  v.ffn_hidden_size = a.vision_ffn_hidden_size;
  v.patch_dim = a.patch_dim;
  v.img_h = a.img_h;
  v.img_w = a.img_w;
  v.class_token = !a.disable_vision_class_token;
  v.projection_type = a.vision_projection_type;
  v.projection_ffn_hidden_size = a.vision_projection_ffn_hidden_size;
  v.text_seq_length = a.dataloader_seq_length + 1;  // and the image token (pretrain_vlm)
  v.freeze_language_model = a.freeze_lm;
  v.freeze_vision_model = a.freeze_vit;
  return v;
}

}  // namespace megatron
