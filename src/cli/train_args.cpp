// The `train` flags in the ArgTable, their cross-flag validation, the vocabulary from the
// tokenizer, and the merge of a Hugging Face config.json into the model flags.
#include "cli/train_args.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "checkpoint/sharded_checkpoint.h"
#include "comm/parallel_state.h"
#include "core/error.h"
#include "core/logging.h"
#include "data/classification_dataset.h"
#include "data/fim_dataset.h"
#include "data/tokenizer.h"
#include "models/model_spec.h"
#include "optim/lr_scheduler.h"
#include "parallel/context_parallel.h"
#include "pipeline/schedule.h"
#include "train/batch_schedule.h"
#include "train/checkpointing.h"
#include "train/datasets.h"
#include "train/exit_signal.h"
#include "train/fault_injection.h"
#include "train/model_config.h"
#include "train/trainer.h"
#include "transformer/mamba/hybrid_pattern.h"

namespace megatron::cli {

void register_model_args(ArgTable& t, Arguments& a) {
  // the flags that fix the architecture (what --use-checkpoint-args restores)
  t.concern("model");
  t.add("--model", a.model, "Model architecture: " + model_names());
  t.add("--num-layers", a.num_layers, "Number of transformer layers");
  t.add("--hidden-size", a.hidden_size, "Transformer hidden size");
  t.add("--ffn-hidden-size", a.ffn_hidden_size,
        "MLP hidden size (default 4 x hidden; 2/3 of that for SwiGLU)");
  t.add("--num-attention-heads", a.num_attention_heads, "Number of attention heads");
  t.flag("--group-query-attention", a.group_query_attention, "Use grouped-query attention");
  t.add("--num-query-groups", a.num_query_groups,
        "Query groups (key/value heads) with --group-query-attention");
  t.add("--kv-channels", a.kv_channels, "Head dimension (default hidden / heads)");
  t.add("--seq-length", a.seq_length, "Sequence length");
  t.add("--max-position-embeddings", a.max_position_embeddings,
        "Rows of the learned position embedding (default seq length)");
  t.add("--position-embedding-type", a.position_embedding_type,
        "learned_absolute, rope, relative (T5's bucketed bias) or none");
  t.add("--encoder-num-layers", a.encoder_num_layers,
        "Encoder layers (Megatron's other name of --num-layers; give one of the two)");
  t.add("--decoder-num-layers", a.decoder_num_layers,
        "Decoder layers of an encoder-decoder model (default: the encoder's)");
  t.add("--encoder-seq-length", a.encoder_seq_length,
        "Encoder sequence length (Megatron's other name of --seq-length; give one of the two)");
  t.add("--decoder-seq-length", a.decoder_seq_length,
        "Decoder sequence length of an encoder-decoder model (T5)");
  t.add("--relative-attention-num-buckets", a.relative_attention_num_buckets,
        "Buckets of --position-embedding-type relative");
  t.add("--relative-attention-max-distance", a.relative_attention_max_distance,
        "Distance beyond which relative positions share a bucket");
  t.add("--softmax-scale", a.softmax_scale,
        "Scale of the attention scores (default 1/sqrt(--kv-channels); Hugging Face's T5 has 1)");
  t.flag("--use-rotary-position-embeddings", a.use_rotary_position_embeddings,
         "Legacy form of --position-embedding-type rope");
  t.negative_flag("--no-position-embedding", "add_position_embedding", a.add_position_embedding,
                  "Deprecated (use --position-embedding-type): allowed with rope only, where it "
                  "changes nothing");
  t.add("--rotary-base", a.rotary_base, "RoPE base");
  t.add("--rotary-percent", a.rotary_percent, "Fraction of the head dimension RoPE rotates");
  t.flag("--rotary-interleaved", a.rotary_interleaved,
         "RoPE rotates channel pairs (2j, 2j+1) instead of (j, j + d/2)");
  t.flag("--use-rope-scaling", a.use_rope_scaling,
         "Llama 3.1's RoPE frequency scaling (low frequencies slowed by --rope-scaling-factor, "
         "original context 8192)");
  t.add("--rope-scaling-factor", a.rope_scaling_factor, "The factor of --use-rope-scaling");
  t.add("--rotary-seq-len-interpolation-factor", a.rotary_seq_len_interpolation_factor,
        "RoPE positions divided by this (linear position interpolation)");
  t.add("--normalization", a.normalization, "LayerNorm or RMSNorm");
  t.add("--norm-epsilon", a.norm_epsilon, "Epsilon of the norms");
  t.flag("--apply-layernorm-1p", a.apply_layernorm_1p,
         "Norm weights centred on zero: the scale is 1 + weight, the weight starts at 0 (better "
         "conditioned in low precision); exported to Hugging Face as 1 + weight");
  t.flag("--swiglu", a.swiglu, "SwiGLU MLP activation");
  t.flag("--gated-linear-unit", a.gated_linear_unit,
         "GeGLU MLP: gelu(gate) x up (T5 v1.1; with --openai-gelu the tanh GELU, HF's gated-gelu)");
  t.flag("--openai-gelu", a.openai_gelu, "tanh-approximated GELU (GPT-2's gelu_new)");
  t.flag("--squared-relu", a.squared_relu, "Squared ReLU MLP activation, relu(x)^2");
  t.flag("--qk-layernorm", a.qk_layernorm,
         "A norm (--normalization) over the head dimension of every query and key head, before "
         "RoPE");
  t.flag("--attention-output-gate", a.attention_output_gate,
         "Gated attention (Qwen3-Next's): linear_qkv also gives each query channel a gate, and "
         "the attention's output is multiplied by sigmoid(gate) before linear_proj");
  t.flag("--qk-l2-norm", a.qk_l2_norm,
         "Llama 4's query/key norm: each query and key head divided by its root mean square "
         "(eps --norm-epsilon, no weight), before RoPE; instead of --qk-layernorm");
  t.add("--no-rope-freq", a.no_rope_freq,
        "Layers without RoPE (Llama 4's NoPE layers): N, every N-th layer (the N-th, 2N-th, "
        "...), or a list expression with one 0/1 per layer, 1 skipping RoPE, e.g. "
        "([0]*3+[1])*3");
  t.add("--window-size", a.window_size,
        "Sliding-window attention \"L,R\": each query sees the L keys before it (R after it: 0 "
        "for causal models; -1 unbounded)");
  t.add("--window-attn-skip-freq", a.window_attn_skip_freq,
        "Layers with full attention among the sliding-window ones: N, every N-th layer, or a "
        "list expression with one 0/1 per layer, 1 for the window, e.g. \"[1,1,1,0]*3\"");
  t.add("--softmax-type", a.softmax_type,
        "Attention softmax: vanilla, off-by-one (1 added to each row's denominator) or learnable "
        "(a learned sink logit per head, gpt-oss's sinks)");
  t.flag("--quick-geglu", a.quick_geglu,
         "Gated MLP with quick GELU, x sigmoid(1.702 x), on the gate (gpt-oss)");
  t.add("--glu-linear-offset", a.glu_linear_offset,
        "Added to the gated MLP's linear half before the product (gpt-oss: 1)");
  t.add("--activation-func-clamp-value", a.activation_func_clamp_value,
        "Gated MLP: the gate clamped above at this value and the linear half to [-v, v] "
        "(gpt-oss: 7)");
  t.add("--yarn-original-max-position-embeddings", a.yarn_original_max_position_embeddings,
        "--position-embedding-type yarn: the original context YaRN's correction range is "
        "computed for (default 4096)");
  t.add("--yarn-beta-fast", a.yarn_beta_fast,
        "--position-embedding-type yarn: the fast boundary's rotations (default 32)");
  t.add("--yarn-beta-slow", a.yarn_beta_slow,
        "--position-embedding-type yarn: the slow boundary's rotations (default 1)");
  t.flag_pair("--yarn-correction-range-round-to-int", "--no-yarn-correction-range-round-to-int",
              a.yarn_correction_range_round_to_int,
              "--position-embedding-type yarn: round the correction range outwards to whole pairs "
              "(the default)",
              "--position-embedding-type yarn: keep the correction range's ends fractional "
              "(Hugging Face's rope_scaling truncate false, gpt-oss)");
  t.add("--hybrid-attention-ratio", a.hybrid_attention_ratio,
        "Hybrid Mamba models: the share of attention layers, spread evenly between the Mamba "
        "layers (Megatron's allocate_layers)");
  t.add("--hybrid-mlp-ratio", a.hybrid_mlp_ratio,
        "Hybrid Mamba models: the share of MLP layers, spread evenly among the Mamba layers");
  t.add("--hybrid-layer-pattern", a.hybrid_layer_pattern,
        "Hybrid Mamba models: one symbol per layer, M (Mamba-2), * (attention), - (MLP) or E "
        "(Mixture of Experts, with --num-experts), e.g. M*M-; '|' between pipeline segments "
        "(one per virtual pipeline stage), '/' before each multi-token prediction depth's "
        "layers (M*M-|M*M-/*-/*-); sets --num-layers and --mtp-num-layers; with a ratio given "
        "it must hold as many of each");
  t.add("--hybrid-override-pattern", a.hybrid_override_pattern,
        "Deprecated spelling of --hybrid-layer-pattern (the same strings)");
  t.add("--mtp-hybrid-override-pattern", a.mtp_hybrid_override_pattern,
        "Legacy: one MTP depth's layers, repeated --mtp-num-layers times after the hybrid "
        "pattern's '/' (use --hybrid-layer-pattern MAIN/MTP/MTP)");
  t.add("--mamba-state-dim", a.mamba_state_dim, "Mamba layers: the state size per channel");
  t.add("--mamba-head-dim", a.mamba_head_dim, "Mamba layers: channels per head");
  t.add("--mamba-num-groups", a.mamba_num_groups,
        "Mamba layers: groups of heads sharing B and C (divisible by the TP size)");
  t.add("--mamba-num-heads", a.mamba_num_heads,
        "Mamba layers: heads (default 2 x --hidden-size / --mamba-head-dim)");
  t.add("--heterogeneous-layers-config-path", a.heterogeneous_layers_config_path,
        "Layers that differ (Llama-Nemotron): a Hugging Face config.json whose block_configs "
        "give each layer's attention and MLP (whole with its own query groups or width, one "
        "linear layer, or a no-op); the other flags must repeat its model-level values");
  t.add("--heterogeneous-layers-config-encoded-json", a.heterogeneous_layers_config_encoded_json,
        "The same config.json as text (checkpoints keep it; wins over the path)");
  t.flag("--is-hybrid-model", a.is_hybrid_model,
         "Megatron's switch to the hybrid FLOPs formula; --model mamba always counts hybrid FLOPs");
  t.add("--spec", a.spec,
        "The layer spec: megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec (the "
        "hybrid Mamba stack, --model mamba) or local (Megatron's non-TE GPT layers, the layers "
        "here); other Python module specs cannot be loaded");
  t.flag("--multi-latent-attention", a.multi_latent_attention,
         "Multi-latent attention (DeepSeek-V2/V3): queries through a --q-lora-rank bottleneck, "
         "keys and values from a shared --kv-lora-rank latent plus one rotary key; its norms with "
         "--qk-layernorm");
  t.add("--q-lora-rank", a.q_lora_rank,
        "MLA: rank of the query bottleneck (unset: one full-rank query projection)");
  t.add("--kv-lora-rank", a.kv_lora_rank, "MLA: channels of the shared key/value latent");
  t.add("--qk-head-dim", a.qk_head_dim, "MLA: content channels of a query or key head");
  t.add("--qk-pos-emb-head-dim", a.qk_pos_emb_head_dim,
        "MLA: rotary channels of a query or key head (the rotary key is shared by all heads)");
  t.add("--v-head-dim", a.v_head_dim, "MLA: channels of a value head");
  t.add("--rotary-scaling-factor", a.rotary_scaling_factor,
        "MLA: YaRN's scaling factor (1: plain RoPE frequencies)");
  t.add("--mscale", a.mscale, "MLA: YaRN's mscale (cos and sin scaled by mscale ratios)");
  t.add("--mscale-all-dim", a.mscale_all_dim,
        "MLA: YaRN's mscale_all_dim (also scales the attention softmax)");
  t.add("--rope-type", a.rope_type,
        "rope or yarn: MLA's rotary embedding (default yarn); other attention takes rope only");
  t.add("--mtp-num-layers", a.mtp_num_layers,
        "Multi-token prediction (DeepSeek-V3): depths after the decoder, each predicting one "
        "token further with its own transformer layer and the shared embedding and output layer");
  t.add("--mtp-loss-scaling-factor", a.mtp_loss_scaling_factor,
        "Weight of the multi-token prediction depths' mean loss in the objective");
  t.flag("--mtp-use-repeated-layer", a.mtp_use_repeated_layer,
         "Multi-token prediction: one block (its layers, norms and projection) applied at every "
         "depth instead of one per depth (Nemotron 3 Super's MTP)");
  t.flag("--mtp-detach-heads", a.mtp_detach_heads,
         "Multi-token prediction: the depths read the decoder's output, the embeddings and the "
         "output weight detached, so their losses train the MTP blocks only, which are clipped "
         "by a gradient norm of their own (left out of the logged one)");
  t.flag("--init-method-xavier-uniform", a.init_method_xavier_uniform,
         "Xavier-uniform initialisation of the linear layers' weights");
  t.add("--embedding-init-method-std", a.embedding_init_method_std,
        "Std of the normal init of the word and position embeddings (default --init-method-std)");
  t.flag("--use-mup", a.use_mup,
         "Maximal Update Parameterization: with width multiplier m = hidden size / "
         "--mup-base-hidden-size, matrices drawn with std / sqrt(m), the output projections' "
         "std / sqrt(2 layers m) (hybrid models: layers m); embeddings (and an untied output "
         "layer) with the embeddings' "
         "std; embeddings scaled by --mup-embedding-mult, logits by --mup-output-mult; attention "
         "scale sqrt(--mup-base-head-dim) / head_dim^--mup-attn-scale-power; Adam's hidden "
         "matrices at lr / m and eps / m (SGD: the vectors and embeddings at lr m)");
  t.add("--mup-width-mult", a.mup_width_mult,
        "Computed as hidden size / --mup-base-hidden-size (a given value is replaced, as in "
        "Megatron)");
  t.add("--mup-base-hidden-size", a.mup_base_hidden_size,
        "The base (proxy) model's hidden size the width multiplier is relative to (default: "
        "this hidden size, m = 1)");
  t.add("--mup-embedding-mult", a.mup_embedding_mult,
        "With --use-mup: the embeddings' output multiplied by this");
  t.add("--mup-output-mult", a.mup_output_mult,
        "With --use-mup: the logits multiplied by this (1 stands for 1 / width multiplier)");
  t.add("--mup-base-head-dim", a.mup_base_head_dim,
        "With --use-mup: the attention scale's numerator is sqrt of this (default 1)");
  t.add("--mup-attn-scale-power", a.mup_attn_scale_power,
        "With --use-mup: the attention scale's head-dim power (1: 1/d, 0.5: 1/sqrt(d))");
  t.flag("--fp32-residual-connection", a.fp32_residual_connection,
         "Keep the residual stream in fp32 with --bf16/--fp16 (always the case here: activations "
         "are fp32, only GEMM inputs are 16-bit)");
  t.flag("--disable-bias-linear", a.disable_bias_linear, "No biases in linear layers");
  t.flag("--add-qkv-bias", a.add_qkv_bias,
         "Bias on the QKV projection even with --disable-bias-linear");
  t.flag("--untie-embeddings-and-output-weights", a.untie_embeddings_and_output_weights,
         "Separate output layer instead of the tied word embeddings");
  t.add("--num-experts", a.num_experts, "Experts per MoE layer (Mixture of Experts; 0: dense)");
  t.add("--moe-layer-freq", a.moe_layer_freq,
        "Which layers are MoE: N (every N-th from layer 0) or a list expression such as "
        "([0]*3+[1]*5)");
  t.add("--moe-ffn-hidden-size", a.moe_ffn_hidden_size,
        "FFN width of each expert (default --ffn-hidden-size)");
  t.add("--moe-shared-expert-intermediate-size", a.moe_shared_expert_intermediate_size,
        "Total FFN width of the shared experts (applied to every token; default none)");
  t.add("--moe-latent-size", a.moe_latent_size,
        "LatentMoE (Nemotron 3): the routed experts run at this width, between projections "
        "from and back to the hidden size (fc1_latent_proj, fc2_latent_proj); default none");
  t.flag("--moe-shared-expert-overlap", a.moe_shared_expert_overlap,
         "Overlap the shared experts with the token exchange (alltoall dispatcher); on the CPU "
         "they run after the routed experts, the same result");
  t.flag("--moe-shared-expert-gate", a.moe_shared_expert_gate,
         "Scale the shared experts' output per token by sigmoid(x w) with a learned w [1, h] "
         "(Qwen2-MoE's shared_expert_gate); only with --moe-shared-expert-intermediate-size");
  t.add("--moe-router-topk", a.moe_router_topk, "Experts per token");
  t.add("--moe-router-score-function", a.moe_router_score_function, "softmax or sigmoid");
  t.flag("--moe-router-pre-softmax", a.moe_router_pre_softmax,
         "Softmax over all experts before the top-k (default: over the k selected)");
  t.add("--moe-router-topk-scaling-factor", a.moe_router_topk_scaling_factor,
        "Multiplies the routing probabilities");
  t.add("--moe-router-num-groups", a.moe_router_num_groups,
        "Expert groups for group-limited routing (device- or node-limited)");
  t.add("--moe-router-group-topk", a.moe_router_group_topk,
        "Groups a token may use with --moe-router-num-groups");
  t.flag("--moe-router-enable-expert-bias", a.moe_router_enable_expert_bias,
         "Aux-loss-free balancing: a per-expert bias on the selection scores, updated each step "
         "(sigmoid scores)");
  t.add("--moe-router-bias-update-rate", a.moe_router_bias_update_rate,
        "Step of the expert-bias update");
  t.add("--moe-router-dtype", a.moe_router_dtype,
        "fp32 or fp64: the gating GEMM in that dtype (routing math is f64 here)");
  t.add("--moe-router-load-balancing-type", a.moe_router_load_balancing_type,
        "aux_loss, seq_aux_loss, sinkhorn or none (one or more, with --moe-aux-loss-coeff each)");
  t.add("--moe-aux-loss-coeff", a.moe_aux_loss_coeff, "Coefficient of each load-balancing loss");
  t.add("--moe-z-loss-coeff", a.moe_z_loss_coeff, "Coefficient of the router z-loss");
  t.add("--moe-input-jitter-eps", a.moe_input_jitter_eps,
        "Router input multiplied by U(1 - eps, 1 + eps) in training");
  t.flag("--moe-router-force-load-balancing", a.moe_router_force_load_balancing,
         "Benchmarks only: the routers route on standard normal random logits (gradients pass "
         "through to the gating GEMM unchanged), so every expert gets its share of tokens");
  t.flag("--moe-apply-probs-on-input", a.moe_apply_probs_on_input,
         "The routing probability multiplies each expert's input instead of its activation "
         "(Llama 4's experts; --moe-router-topk 1 only)");
  t.add("--moe-expert-capacity-factor", a.moe_expert_capacity_factor,
        "Tokens per expert at most capacity factor x tokens x topk / experts (default dropless)");
  t.add("--moe-token-drop-policy", a.moe_token_drop_policy,
        "probs (drop the lowest probabilities) or position (drop the latest tokens)");
  t.flag("--moe-pad-expert-input-to-capacity", a.moe_pad_expert_input_to_capacity,
         "Every expert gets exactly its capacity of rows (padding with probability 0)");
  t.add("--moe-token-dispatcher-type", a.moe_token_dispatcher_type, "allgather or alltoall");
  t.flag("--moe-grouped-gemm", a.moe_grouped_gemm,
         "The experts' GEMMs as grouped GEMMs (one op over all local experts); the CPU device "
         "always runs them so, with or without the flag");
  t.flag("--moe-per-layer-logging", a.moe_per_layer_logging,
         "Each MoE layer's load-balancing and z-losses to TensorBoard");
  t.add("--vision-model-type", a.vision_model_type,
        "Vision encoder of --model llava: clip (CLIP ViT: LayerNorm, quick GELU, biases)");
  t.add("--vision-hidden-size", a.vision_hidden_size,
        "Hidden size of the vision encoder (default: --hidden-size, as pretrain_vlm copies the "
        "language model's config)");
  t.add("--vision-num-attention-heads", a.vision_num_attention_heads,
        "Attention heads of the vision encoder (default: --num-attention-heads)");
  t.add("--vision-ffn-hidden-size", a.vision_ffn_hidden_size,
        "MLP width of the vision encoder (default: 4 x its hidden size)");
  t.add("--img-h", a.img_h, "Image height the vision encoder takes (images are resized to it)");
  t.add("--img-w", a.img_w, "Image width the vision encoder takes");
  t.add("--patch-dim", a.patch_dim, "Side of the vision encoder's square patches");
  t.flag("--disable-vision-class-token", a.disable_vision_class_token,
         "Drop the ViT's class token: each image becomes its patches' embeddings only");
  t.add("--vision-projection-type", a.vision_projection_type,
        "Projector from the vision encoder to the language model: mlp (two layers, GELU) or "
        "affine (one)");
  t.add("--vision-projection-ffn-hidden-size", a.vision_projection_ffn_hidden_size,
        "Width of the mlp projector (default: --hidden-size, Hugging Face LLaVA's)");
  t.add("--dataloader-seq-length", a.dataloader_seq_length,
        "Text tokens per image-text sample (default --seq-length); the language model's "
        "sequence is these plus each image's embeddings");
  t.concern("training");  // what a run trains, not what the model is: never restored
  t.flag("--freeze-LM", a.freeze_lm,
         "Train no language-model weight (no gradient buffers or optimizer state for them)");
  t.flag("--freeze-ViT", a.freeze_vit,
         "Train no vision-encoder weight (no gradient buffers or optimizer state for them)");
  t.add("--hidden-dropout", a.hidden_dropout, "Dropout after attention/MLP and on embeddings");
  t.add("--attention-dropout", a.attention_dropout, "Dropout on attention probabilities");
  t.add("--init-method-std", a.init_method_std, "Std of the normal weight init");
  t.flag("--moe-use-upcycling", a.moe_use_upcycling,
         "Upcycle the dense model of --load into this MoE model (its MLPs copied into the experts, "
         "Megatron's scaling), saved to --save as iteration 1 and trained from there; only for "
         "the first run");
  t.add("--moe-upcycling-granularity", a.moe_upcycling_granularity,
        "Upcycling: how many times the dense FFN is wider than an expert (each dense MLP cut into "
        "this many experts)");
  t.concern("model");
  t.add("--make-vocab-size-divisible-by", a.make_vocab_size_divisible_by,
        "Pad the vocabulary to a multiple of this");
  t.add("--padded-vocab-size", a.padded_vocab_size,
        "The model's vocabulary (embedding rows, logits) as given, instead of the tokenizer's "
        "rounded up to --make-vocab-size-divisible-by x TP; at least the tokenizer's, divisible "
        "by TP");
  t.add("--vocab-size", a.vocab_size, "Vocabulary size (NullTokenizer and mock data)");
  t.add("--transformer-block-type", a.transformer_block_type,
        "pre_ln (Megatron's norm placement) or post_ln (norms after the residual adds and on "
        "the embeddings: original BERT)");
  t.flag("--bert-no-binary-head", a.bert_no_binary_head,
         "BERT without the sentence-order head (no token types, pooler or binary head)");
  t.concern("tokenizer");
  t.add("--tokenizer-type", a.tokenizer_type,
        "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, BertWordPieceLowerCase, "
        "BertWordPieceCase, TikTokenizer or NullTokenizer");
  t.add("--vocab-file", a.vocab_file, "GPT-2 BPE vocabulary (encoder.json) or WordPiece vocab.txt");
  t.add("--vocab-extra-ids", a.vocab_extra_ids,
        "WordPiece: append <extra_id_0> .. <extra_id_{N-1}> sentinel tokens");
  t.add("--merge-file", a.merge_file, "GPT-2 BPE merges (vocab.bpe)");
  t.add("--tokenizer-model", a.tokenizer_model,
        "tokenizer.json, SentencePiece model or TikTokenizer vocabulary JSON");
  t.add("--tiktoken-pattern", a.tiktoken_pattern,
        "TikTokenizer's pre-tokenizer: v1 or v2 (Megatron's PATTERN_TIKTOKEN, _V2)");
  t.add("--tiktoken-num-special-tokens", a.tiktoken_num_special_tokens,
        "TikTokenizer: ids before the vocabulary held by special tokens");
  t.add("--tiktoken-special-tokens", a.tiktoken_special_tokens,
        "TikTokenizer's named special tokens, with <unk> <s> </s> (default: those three)");
  t.add("--null-tokenizer-eod-id", a.null_tokenizer_eod_id,
        "NullTokenizer's end-of-document id (-1: --vocab-size - 1)");
  t.add("--null-tokenizer-pad-id", a.null_tokenizer_pad_id,
        "NullTokenizer's pad id, masked out of GPT data's loss and read as 0 (-1: none); pick "
        "an id the data does not use for real tokens");
  t.flag("--tokenizer-hf-no-include-special-tokens", a.tokenizer_hf_no_include_special_tokens,
         "HuggingFaceTokenizer: encode without the post-processor's tokens (a BOS, say) and decode "
         "without special tokens, as Megatron core 0.19's tokenize + convert_tokens_to_ids");
  t.concern("checkpoint");
  t.add("--pretrained-checkpoint", a.pretrained_checkpoint,
        "Weights to start from: a Hugging Face model directory (config.json + safetensors) or "
        "one of our checkpoints (its latest iteration; tensors the model lacks are skipped, "
        "parameters the checkpoint lacks keep their initialisation)");
  t.add("--pretrained-vision-checkpoint", a.pretrained_vision_checkpoint,
        "--model llava: a Hugging Face CLIP directory (CLIPModel, CLIPVisionModel) whose vision "
        "tower starts the vision encoder (Megatron's combine step; the language model from "
        "--pretrained-checkpoint)");
  t.concern("precision");
  t.flag("--bf16", a.bf16,
         "bf16 compute weights and GEMM inputs; fp32 main weights, gradients and accumulation");
  t.flag("--fp16", a.fp16,
         "fp16 compute weights and GEMM inputs with loss scaling; fp32 main weights and gradients");
  register_fp8_args(t, a);
  t.add("--loss-scale", a.loss_scale,
        "Static loss scaling for fp16 (a positive power of 2 helps); default: dynamic scaling");
  t.add("--initial-loss-scale", a.initial_loss_scale, "Initial loss scale for dynamic scaling");
  t.add("--min-loss-scale", a.min_loss_scale, "Minimum loss scale for dynamic scaling");
  t.add("--loss-scale-window", a.loss_scale_window,
        "Window over which to raise/lower dynamic scale");
  t.add("--hysteresis", a.hysteresis, "Hysteresis for dynamic loss scaling");
  t.flag("--attention-softmax-in-fp32", a.attention_softmax_in_fp32,
         "Run attention masking and softmax in fp32 (always the case here)");
  t.flag("--grad-reduce-in-bf16", a.grad_reduce_in_bf16, "Reduce gradients in bfloat16");
  t.flag("--ddp-reduce-scatter-with-fp32-accumulation", a.ddp_reduce_scatter_with_fp32_accumulation,
         "The distributed optimizer's gradient reduce-scatter as an all-to-all in the reduction "
         "dtype (bf16 with --grad-reduce-in-bf16) and a local sum in fp32 over the ranks, in rank "
         "order (no effect without --use-distributed-optimizer)");
  t.add("--ddp-param-name-patterns-for-fp32-local-accumulation",
        a.ddp_param_name_patterns_for_fp32_local_accumulation,
        "Parameters (fnmatch patterns, or 'all') whose gradients accumulate over micro-batches in "
        "fp32 under --grad-reduce-in-bf16; here every parameter's do (the gradient buffer is "
        "fp32, rounded to bf16 only for the reduction)");
  t.flag("--accumulate-allreduce-grads-in-fp32", a.accumulate_allreduce_grads_in_fp32,
         "Gradient accumulation and all-reduce in fp32 (always the case here)");
  t.concern("parallel");
  t.add("--tensor-model-parallel-size", a.tensor_model_parallel_size,
        "Degree of tensor model parallelism");
  t.add("--pipeline-model-parallel-size", a.pipeline_model_parallel_size,
        "Degree of pipeline model parallelism");
  t.add("--decoder-first-pipeline-num-layers", a.decoder_first_pipeline_num_layers,
        "Transformer layers of the first pipeline stage (uneven split; the middle stages share "
        "the rest evenly; 0: even split)");
  t.add("--decoder-last-pipeline-num-layers", a.decoder_last_pipeline_num_layers,
        "Transformer layers of the last pipeline stage (uneven split; 0: even split)");
  t.flag("--account-for-embedding-in-pipeline-split", a.account_for_embedding_in_pipeline_split,
         "Count the embedding as one layer of the first pipeline stage when splitting the layers");
  t.flag("--account-for-loss-in-pipeline-split", a.account_for_loss_in_pipeline_split,
         "Count the output layer and loss as one layer of the last pipeline stage when splitting "
         "the layers");
  t.add("--pipeline-model-parallel-layout", a.pipeline_model_parallel_layout,
        "Every virtual pipeline stage spelled out, e.g. \"Et*3|(tt|)*29,L\": '|' between "
        "stages (pp x V of them: V follows), E the embedding, t a transformer layer, L the loss, "
        "(...)*n and x*n repeat");
  t.add("--expert-model-parallel-size", a.expert_model_parallel_size,
        "Degree of expert parallelism: each MoE layer's experts split over this many ranks");
  t.add("--expert-tensor-parallel-size", a.expert_tensor_parallel_size,
        "Degree of tensor parallelism inside each expert (default --tensor-model-parallel-size)");
  t.flag("--sequence-parallel", a.sequence_parallel,
         "Enable sequence parallel optimization (with --tensor-model-parallel-size > 1; "
         "switched off with a warning at 1)");
  t.concern("runtime");
  t.add("--num-threads", a.num_threads, "OpenMP threads (default: cores available to the process)");
  t.add("--device", a.device,
        "Where the model computes: cpu, cuda (one GPU per rank, by local rank), or auto (cuda "
        "where this build has the CUDA device and a GPU is visible, else cpu)");
  t.flag("--tf32", a.tf32,
         "Let f32 GEMMs on a GPU use TF32 tensor cores (faster, 10-bit mantissa products; off: "
         "f32 results match the CPU's)");
}

void register_train_args(ArgTable& t, Arguments& a) {
  register_model_args(t, a);
  // Training only: `megatron evaluate` has its own --task and --valid-data.
  t.concern("finetuning");
  t.add("--task", a.task,
        "Finetuning task (megatron finetune): classification (text_a, text_b, label), MNLI, QQP");
  t.add("--train-data", a.train_data, "Finetuning training files (.tsv with a header, .jsonl)");
  t.add("--valid-data", a.valid_data, "Finetuning validation files (.tsv with a header, .jsonl)");
  t.add("--epochs", a.epochs,
        "Finetuning epochs over --train-data (sets --train-iters: epochs x examples / global "
        "batch)");
  t.concern("parallel");
  t.add("--num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage,
        "Number of layers per virtual pipeline stage (interleaved 1F1B; 0: none)");
  t.add("--num-virtual-stages-per-pipeline-rank", a.num_virtual_stages_per_pipeline_rank,
        "Number of virtual pipeline stages per pipeline parallelism rank (0: none)");
  t.add("--microbatch-group-size-per-virtual-pipeline-stage", a.microbatch_group_size_per_vp_stage,
        "Interleaved schedule: micro-batches run on one virtual stage before the next (default "
        "the pipeline size, depth-first; the number of micro-batches: breadth-first)");
  t.add("--context-parallel-size", a.context_parallel_size,
        "Degree of context parallelism: every sequence split over this many ranks");
  t.flag("--use-tp-pp-dp-mapping", a.use_tp_pp_dp_mapping,
         "Rank order tp-cp-ep-pp-dp instead of Megatron's default tp-cp-ep-dp-pp: a data-parallel "
         "replica's pipeline stages on adjacent ranks, its replicas furthest apart");
  t.add("--cp-comm-type", a.cp_comm_type,
        "Communication of context-parallel attention: p2p (a ring, overlapped with compute), "
        "allgather, a2a (all-to-all over heads) or a2a+p2p (hierarchical); one value for every "
        "layer or one per layer");
  t.add("--hierarchical-context-parallel-sizes", a.hierarchical_context_parallel_sizes,
        "Sizes of the two levels of a2a+p2p context parallelism: INNER (all-to-all) OUTER (ring)");
  t.flag("--use-distributed-optimizer", a.use_distributed_optimizer,
         "Use distributed optimizer: shard the Adam moments over data-parallel ranks");
  t.add("--num-distributed-optimizer-instances", a.num_distributed_optimizer_instances,
        "Copies of the distributed optimizer: the data-parallel (x context-parallel) ranks split "
        "into this many consecutive instances, each sharding the state over its own ranks; "
        "gradients are reduce-scattered within an instance, then summed across instances");
  t.flag("--overlap-grad-reduce", a.overlap_grad_reduce, "If set, overlap DDP grad reduce");
  t.flag("--overlap-param-gather", a.overlap_param_gather,
         "With the distributed optimizer: the all-gather of the updated weights runs during the "
         "next forward, each bucket waited for just before the first layer that reads it");
  t.add("--ddp-num-buckets", a.ddp_num_buckets,
        "Cut this rank's parameters into about this many gradient buckets (bucket size: its "
        "parameter count / N, Megatron's rule) instead of --ddp-bucket-size; the buckets apply "
        "on every pipeline stage and model chunk, overlapped or not (Megatron keeps one bucket "
        "per buffer on later stages and chunks and without --overlap-grad-reduce: the same "
        "numbers either way)");
  t.add("--ddp-bucket-size", a.ddp_bucket_size,
        "Bucket size for data-parallel communication, in elements "
        "(0: max(40000000, 1000000 x data parallel size))");
  register_fsdp_args(t, a);
  t.concern("memory");
  t.add("--recompute-granularity", a.recompute_granularity,
        "Activation recomputation: full (whole layers, see --recompute-method) or selective "
        "(core attention only); default none");
  t.add("--recompute-method", a.recompute_method,
        "With --recompute-granularity full: uniform (chunks of --recompute-num-layers layers, "
        "only each chunk's input kept) or block (the first --recompute-num-layers layers of each "
        "pipeline stage)");
  t.add("--recompute-num-layers", a.recompute_num_layers,
        "Layers per recomputed chunk (uniform) or recomputed layers per pipeline stage (block)");
  t.flag("--distribute-saved-activations", a.distribute_saved_activations,
         "With full recomputation: keep each recomputed chunk's input split over the tensor-"
         "parallel ranks (1/tp each), all-gathered before it is recomputed (not with sequence "
         "parallelism, which splits it already)");
  t.flag("--recompute-activations", a.recompute_activations,
         "Deprecated: the same as --recompute-granularity selective");
  t.add("--recompute-modules", a.recompute_modules,
        "What --recompute-granularity selective recomputes (default core_attn): core_attn, mlp "
        "(dense MLPs), moe (whole MoE layers), shared_experts, moe_act (the experts' "
        "activation), layernorm (the input and pre-MLP norms' outputs), mla_up_proj "
        "(multi-latent attention's up projections and RoPE)");
  t.flag("--moe-layer-recompute", a.moe_layer_recompute,
         "Deprecated: --recompute-granularity selective with the moe module");
  t.concern("training");
  t.add("--micro-batch-size", a.micro_batch_size, "Sequences per micro-batch");
  t.add("--global-batch-size", a.global_batch_size,
        "Sequences per iteration (default micro batch x data parallel)");
  t.add("--train-iters", a.train_iters,
        "Training iterations (iteration-based training; or --train-samples)");
  t.add("--train-samples", a.train_samples,
        "Training samples (sample-based training: the iterations follow from the batch "
        "schedule; the LR schedule is then given in samples)");
  t.add("--rampup-batch-size", a.rampup_batch_size,
        "Batch-size ramp-up START INCREMENT SAMPLES: the global batch starts at START and grows "
        "by INCREMENT evenly over SAMPLES samples (with --train-samples, or with --train-iters as "
        "Megatron's GPT-3 example uses it)");
  t.add("--phase-transition-iterations", a.phase_transition_iterations,
        "Comma-separated iterations where the data changes: a job saves and exits at the next "
        "one; the job resumed from it builds its training data for its phase alone and reads "
        "it from the start (a constant global batch size across phases)");
  t.add("--iterations-to-skip", a.iterations_to_skip,
        "Iterations whose batch is read and dropped without a step (Megatron's count before "
        "the step: 5 skips the iteration logged as 6); their samples count as skipped");
  t.flag("--decrease-batch-size-if-needed", a.decrease_batch_size_if_needed,
         "Round a global batch that does not split into micro-batch x data-parallel pieces down "
         "to one that does (the rest counts as skipped samples) instead of refusing it");
  t.concern("logging");
  t.flag("--log-expert-load", a.log_expert_load,
         "Log each step's expert load: the busiest expert's tokens over the mean, averaged over "
         "the MoE layers");
  t.add("--log-interval", a.log_interval, "Iterations between log lines");
  t.flag("--test-mode", a.test_mode,
         "Megatron's real-time test: every iteration the query/key norms' weights (--qk-layernorm) "
         "must be the same bits on every data-parallel replica and tensor-parallel rank; a "
         "difference (silent corruption) ends the run naming them");
  t.add("--check-weight-hash-across-dp-replicas-interval",
        a.check_weight_hash_across_dp_replicas_interval,
        "Every N iterations (and before training) check that the data-parallel replicas hold "
        "the same weights, bit for bit; a difference stops the run (exit 1). 0: never");
  t.add("--timing-log-level", a.timing_log_level,
        "Granularity of the step-time report printed every --log-interval: 0 none, 1 the "
        "step's phases (batch, forward-backward, gradient sync, optimizer, communication), 2 "
        "also the time inside each kind of kernel (GEMM, attention, norms and elementwise, "
        "cross entropy, optimizer), and at the end of training rank 0's mean time per step in "
        "each op");
  t.concern("training");
  t.add("--seed", a.seed, "Random seed (weights, dropout, data)");
  t.add("--optimizer", a.optimizer,
        "Optimizer: adam (AdamW), sgd (SGD with momentum and L2 weight decay, Megatron's "
        "FusedSGD), muon (Muon's orthogonalised momentum for the matrices, AdamW or Lion for the "
        "rest), lion (Lion, the sign of an interpolated momentum, for the matrices; AdamW for the "
        "rest) or onebit_adam "
        "(DeepSpeed's 1-bit Adam: compressed momentum exchange after --onebit-freeze-step "
        "steps)");
  t.add("--sgd-momentum", a.sgd_momentum, "Momentum factor for sgd (0: no momentum buffer)");
  t.add("--onebit-freeze-step", a.onebit_freeze_step,
        "1-bit Adam: steps of full Adam (gradients all-reduced) before the variance freezes and "
        "the momentum is exchanged compressed (DeepSpeed's freeze_step)");
  register_precision_aware_args(t, a);
  register_muon_args(t, a);
  register_qk_clip_args(t, a);
  t.add("--lr", a.lr, "Peak learning rate");
  t.add("--min-lr", a.min_lr, "Minimum learning rate");
  t.flag("--override-opt_param-scheduler", a.override_opt_param_scheduler,
         "On --load, keep this run's learning-rate and weight-decay schedule parameters (by "
         "default they must equal the checkpoint's)");
  t.flag("--use-checkpoint-opt_param-scheduler", a.use_checkpoint_opt_param_scheduler,
         "On --load, take the learning-rate and weight-decay schedule parameters from the "
         "checkpoint instead of the flags");
  // Core 0.19's spellings without the underscore.
  t.alias("--override-opt-param-scheduler", "--override-opt_param-scheduler");
  t.alias("--use-checkpoint-opt-param-scheduler", "--use-checkpoint-opt_param-scheduler");
  t.add("--lr-decay-style", a.lr_decay_style,
        "constant, linear, cosine, inverse-square-root or WSD");
  t.add("--lr-decay-iters", a.lr_decay_iters, "Iterations to decay over (default --train-iters)");
  t.add("--lr-warmup-iters", a.lr_warmup_iters, "Linear warm-up iterations");
  t.add("--lr-warmup-fraction", a.lr_warmup_fraction,
        "Warm-up as a fraction of the decay iterations");
  t.add("--lr-warmup-init", a.lr_warmup_init, "Learning rate at the start of warm-up");
  t.add("--lr-wsd-decay-iters", a.lr_wsd_decay_iters, "WSD: iterations of the final decay");
  t.add("--lr-decay-samples", a.lr_decay_samples,
        "Samples to decay over (sample-based training; default --train-samples)");
  t.add("--lr-warmup-samples", a.lr_warmup_samples,
        "Linear warm-up samples (sample-based training)");
  t.add("--lr-wsd-decay-samples", a.lr_wsd_decay_samples,
        "WSD: samples of the final decay (sample-based training)");
  t.add("--lr-wsd-decay-style", a.lr_wsd_decay_style,
        "WSD decay: exponential, linear, cosine, minus_sqrt");
  t.add("--weight-decay", a.weight_decay, "AdamW weight decay (not applied to biases and norms)");
  t.flag("--apply-wd-to-qk-layernorm", a.apply_wd_to_qk_layernorm,
         "Weight decay on the q_layernorm and k_layernorm weights too (Qwen3-Next's rule; "
         "other norms and biases keep none)");
  t.add("--no-weight-decay-cond-type", a.no_weight_decay_cond_type,
        "Deprecated spelling of --apply-wd-to-qk-layernorm: apply_wd_to_qk_layernorm");
  t.add("--start-weight-decay", a.start_weight_decay,
        "Weight decay at the start of training (with --weight-decay-incr-style linear/cosine)");
  t.add("--end-weight-decay", a.end_weight_decay,
        "Weight decay at the end of training (with --weight-decay-incr-style linear/cosine)");
  t.add("--weight-decay-incr-style", a.weight_decay_incr_style,
        "Weight decay from --start-weight-decay to --end-weight-decay over the training samples: "
        "constant (--weight-decay throughout), linear or cosine");
  t.add("--decoupled-lr", a.decoupled_lr,
        "Peak learning rate of the word embeddings and the output layer (same schedule); "
        "default --lr");
  t.add("--decoupled-min-lr", a.decoupled_min_lr,
        "Minimum learning rate of the word embeddings and the output layer; default --min-lr");
  t.add("--adam-beta1", a.adam_beta1, "Adam beta1");
  t.add("--adam-beta2", a.adam_beta2, "Adam beta2");
  t.add("--adam-eps", a.adam_eps, "Adam epsilon");
  t.add("--clip-grad", a.clip_grad, "Clip the global gradient L2 norm to this (0: off)");
  t.flag("--calculate-per-token-loss", a.calculate_per_token_loss,
         "The objective is the mean loss over every token of the global batch (gradients summed "
         "over replicas, then divided by the token count), instead of the mean of the "
         "micro-batches' means");
  register_rerun_args(t, a);
  t.concern("data");
  t.flag("--mock-data", a.mock_data, "Train on synthetic data");
  t.add("--data-path", a.data_path, "Dataset prefix, or a blend: weight prefix weight prefix ...");
  t.add("--split", a.split, "Train/validation/test proportions of --data-path, e.g. 969,30,1");
  t.add("--train-data-path", a.train_data_path, "Training dataset prefix(es), instead of --split");
  t.add("--valid-data-path", a.valid_data_path, "Validation dataset prefix(es)");
  t.add("--test-data-path", a.test_data_path, "Test dataset prefix(es)");
  t.add("--data-cache-path", a.data_cache_path, "Directory for the cached sample indices");
  t.add("--data-args-path", a.data_args_path,
        "A file holding the --data-path arguments (prefixes and weights, separated by white "
        "space), for blends too long for a command line");
  t.add("--per-dataset-sequences-path", a.per_dataset_sequences_path,
        "A JSON file {prefix: [sequences, documents + 1]} (Megatron's "
        "tools/build_sequences_per_dataset.py), the .idx headers' counts of every dataset "
        "prefix; GPT and hybrid data check each prefix's entry against its .idx (a stale file "
        "stops the run)");
  t.flag("--dataloader-fast-cache-load", a.dataloader_fast_cache_load,
         "Megatron's fast path for prebuilt sample-index caches (needs --data-cache-path and "
         "per-split data paths); the caches here are read when present and built when missing "
         "either way");
  t.flag("--dataloader-defer-npy-index-mmap", a.dataloader_defer_npy_index_mmap,
         "Megatron's deferred mapping of the cached sample indices (needs --data-cache-path); "
         "the indices here are read as they are whichever way");
  t.add("--per-split-data-args-path", a.per_split_data_args_path,
        "A JSON file {\"train\": ..., \"valid\": ..., \"test\": ...}, each a list (or a "
        "white-space separated string) of prefixes and weights, instead of "
        "--train-data-path/--valid-data-path/--test-data-path");
  t.flag("--reset-position-ids", a.reset_position_ids,
         "Restart position ids after each end of document");
  t.flag("--reset-attention-mask", a.reset_attention_mask,
         "Attention does not cross end of document");
  t.add("--mask-prob", a.mask_prob, "BERT: probability of masking a token (masked LM)");
  t.add("--short-seq-prob", a.short_seq_prob,
        "BERT: probability of a sample shorter than --seq-length");
  t.add("--num-workers", a.num_workers,
        "Micro-batches prepared ahead on a background thread (0: prepared in the training loop)");
  t.flag("--sft", a.sft,
         "Supervised finetuning: --data-path (or the per-split paths) are JSON-lines files of "
         "conversations ({\"messages\": [{\"role\", \"content\"}, ...]}), rendered with "
         "--sft-tokenizer-prompt-format, the loss on the assistant turns only; with "
         "--tokenizer-type SFTTokenizer");
  t.add("--sft-tokenizer-prompt-format", a.sft_tokenizer_prompt_format,
        "The chat template of --sft (Megatron's: nemotron-h-aligned)");
  t.add("--dataloader-type", a.dataloader_type,
        "single: the samples in order; cyclic: a random order per epoch (torch.randperm seeded "
        "with the epoch), repeating the data as long as the run reads");
  t.negative_flag("--no-data-sharding", "data_sharding", a.data_sharding,
                  "--dataloader-type cyclic: shuffle the whole dataset for every data-parallel "
                  "rank, instead of one contiguous bucket of it per rank (no effect with "
                  "single, as in Megatron)");
  t.concern("evaluation");
  t.add("--eval-interval", a.eval_interval, "Iterations between validation runs");
  t.add("--eval-iters", a.eval_iters,
        "Iterations (global batches) per validation run; 0: no evaluation");
  t.flag("--full-validation", a.full_validation,
         "Each evaluation reads the whole validation set once (one epoch of it, every sample "
         "counted once); --eval-iters then sizes the test evaluation only");
  t.add("--mid-level-dataset-surplus", a.mid_level_dataset_surplus,
        "A blend builds each of its datasets with this share more samples than its weight asks "
        "(Megatron's margin for the blending's rounding; its error names this flag)");
  t.flag("--multiple-validation-sets", a.multiple_validation_sets,
         "With several --valid-data-path prefixes and --full-validation: evaluate and log each "
         "prefix as its own set (validation-0, validation-1, ...) instead of their blend");
  t.add("--eval-micro-batch-size", a.eval_micro_batch_size,
        "Micro-batch size of the evaluations (default --micro-batch-size): the same samples, "
        "split differently");
  t.add("--eval-global-batch-size", a.eval_global_batch_size,
        "Samples per evaluation iteration (default --global-batch-size); a multiple of "
        "--eval-micro-batch-size x the data-parallel size. Sizes the validation and test splits "
        "as Megatron does (--eval-iters x this per evaluation)");
  t.add("--start-eval-at-iter", a.start_eval_at_iter,
        "Evaluate during training only from this iteration on (the evaluation after training "
        "runs always); the validation split is sized for the evaluations left");
  t.add("--validation-set-names", a.validation_set_names,
        "With --multiple-validation-sets: one name per validation set, logged as "
        "validation-NAME instead of validation-INDEX");
  t.flag("--skip-train", a.skip_train,
         "No training: evaluate the weights (--load) on the validation and test data, once");
  t.concern("data");
  t.flag("--eod-mask-loss", a.eod_mask_loss, "No loss on end-of-document input tokens");
  t.flag("--fim-data", a.fim_data,
         "Fill-in-the-middle samples (Megatron's GPTFIMDataset; a HuggingFaceTokenizer with the "
         "FIM tokens)");
  t.add("--fim-rate", a.fim_rate, "Probability that a document segment is permuted (FIM)");
  t.add("--fim-spm-rate", a.fim_spm_rate,
        "Probability that a permuted segment is written suffix-prefix-middle (else PSM)");
  t.add("--fim-split-sample", a.fim_split_sample,
        "A token (e.g. a file separator) at which segments are split again, each fragment "
        "permuted with --fim-fragment-rate");
  t.add("--fim-fragment-rate", a.fim_fragment_rate,
        "Probability that a fragment is permuted (with --fim-split-sample)");
  t.add("--fim-no-prefix", a.fim_no_prefix,
        "Fragments whose text starts with this are never permuted");
  t.add("--fim-prefix-token", a.fim_prefix_token, "FIM prefix token");
  t.add("--fim-middle-token", a.fim_middle_token, "FIM middle token");
  t.add("--fim-suffix-token", a.fim_suffix_token, "FIM suffix token");
  t.add("--fim-pad-token", a.fim_pad_token,
        "FIM pad token (fills a sample the permutation shortened)");
  t.add("--fim-eod-token", a.fim_eod_token,
        "The token between documents, at which samples are cut into segments");
  t.flag("--dataloader-inter-document-masking", a.dataloader_inter_document_masking,
         "Each document of a sample is its own sequence (Megatron's packed sequences): attention "
         "stays inside it, positions restart at it, Mamba layers restart their state and "
         "multi-token prediction rolls within it; the boundaries are the dataset's documents (no "
         "EOD needed); overrides --reset-attention-mask and --reset-position-ids");
  t.flag("--allow-ambiguous-pad-tokens", a.allow_ambiguous_pad_tokens,
         "Mask the tokenizer's pad id out of GPT data's loss even where it is also the EOD or "
         "EOS token: those lose their loss too and read as id 0. Without it such a pad is not "
         "masked at all (a warning says so)");
  t.concern("logging");
  t.add("--tensorboard-dir", a.tensorboard_dir, "Write TensorBoard event files here");
  t.add("--tensorboard-log-interval", a.tensorboard_log_interval,
        "Iterations between TensorBoard points");
  t.flag("--log-throughput", a.log_throughput,
         "Accepted for compatibility: throughput is always logged");
  t.flag("--log-params-norm", a.log_params_norm,
         "Log the L2 norm of the (fp32 main) weights after each step");
  t.flag("--log-num-zeros-in-grad", a.log_num_zeros_in_grad,
         "Log the number of zero elements of the gradients");
  t.flag("--log-progress", a.log_progress,
         "Append job starts and checkpoint saves (with throughput, FLOPs and tokens so far) to "
         "progress.txt in the --save directory");
  t.flag("--log-timers-to-tensorboard", a.log_timers_to_tensorboard,
         "Write the iteration time, throughput and (with --timing-log-level) each phase's time "
         "to TensorBoard");
  t.add("--log-memory-interval", a.log_memory_interval,
        "Also print the memory report (Megatron's report_memory) every this many iterations (a "
        "multiple of --log-interval; default: after the first logging interval only)");
  t.flag("--log-memory-to-tensorboard", a.log_memory_to_tensorboard,
         "Write the resident memory (mem-reserved-bytes) and its peak (mem-max-allocated-bytes) "
         "to TensorBoard");
  t.flag("--log-validation-ppl-to-tensorboard", a.log_validation_ppl_to_tensorboard,
         "Write the validation perplexity to TensorBoard");
  t.flag("--log-world-size-to-tensorboard", a.log_world_size_to_tensorboard,
         "Write the world size to TensorBoard");
  t.negative_flag("--no-log-loss-scale-to-tensorboard", "log_loss_scale_to_tensorboard",
                  a.log_loss_scale_to_tensorboard, "Do not write the loss scale to TensorBoard");
  t.alias("--disable-log-loss-scale-to-tensorboard", "--no-log-loss-scale-to-tensorboard");
  t.add("--gemm-peak-gflops", a.gemm_peak_gflops,
        "GEMM peak (GFLOP/s) for model-FLOPs utilisation; default: measured at start-up");
  t.concern("checkpoint");
  t.add("--save", a.save, "Save checkpoints under this directory (iter_NNNNNNN + tracker)");
  t.add("--load", a.load, "Resume from the latest checkpoint under this directory");
  t.add("--save-interval", a.save_interval,
        "Iterations between checkpoints (default: one at the end of training)");
  t.add("--persistent-save-interval", a.persistent_save_interval,
        "Megatron's other name of --save-interval");
  t.add("--save-retain-interval", a.save_retain_interval,
        "Keep only the checkpoints of iterations divisible by this, and the latest (the others "
        "are deleted once a newer one is saved)");
  t.add("--non-persistent-save-interval", a.non_persistent_save_interval,
        "Iterations between non-persistent checkpoints (--non-persistent-ckpt-type global): "
        "only the latest is kept, and a resume takes it when it is newer than --save's");
  t.add("--non-persistent-ckpt-type", a.non_persistent_ckpt_type,
        "global: non-persistent checkpoints in the checkpoint format, under "
        "--non-persistent-global-ckpt-dir (default <save>/non_persistent)");
  t.add("--non-persistent-global-ckpt-dir", a.non_persistent_global_ckpt_dir,
        "Directory of the global non-persistent checkpoints (default <save or load>/"
        "non_persistent)");
  t.negative_flag("--no-save-optim", "save_optim", a.save_optim,
                  "Do not save the optimizer state (weights and run state only)");
  t.negative_flag("--no-save-rng", "save_rng", a.save_rng, "Do not save the RNG state");
  t.negative_flag("--no-load-optim", "load_optim", a.load_optim,
                  "Do not load the optimizer state (moments start at zero)");
  t.negative_flag("--no-load-rng", "load_rng", a.load_rng,
                  "Do not load the RNG state (dropout follows --seed)");
  t.flag("--load-main-params-from-ckpt", a.load_main_params_from_ckpt,
         "With --no-load-optim: the fp32 main weights from the checkpoint, not rounded from the "
         "bf16/fp16 model weights (every load here does this: checkpoints hold the fp32 main "
         "weights)");
  t.flag("--finetune", a.finetune,
         "Load the weights only: iteration, consumed samples, optimizer and RNG start afresh");
  t.flag("--exit-on-missing-checkpoint", a.exit_on_missing_checkpoint,
         "With --load: exit (code 2) when there is no checkpoint instead of starting afresh");
  t.flag("--use-checkpoint-args", a.use_checkpoint_args,
         "Take the model-shape arguments from the --load checkpoint");
  t.negative_flag("--no-use-tokenizer-model-from-checkpoint-args",
                  "use_tokenizer_model_from_checkpoint_args",
                  a.use_tokenizer_model_from_checkpoint_args,
                  "With --use-checkpoint-args, do not take --tokenizer-model (and TikTokenizer's "
                  "settings) from the checkpoint");
  t.alias("--disable-use-tokenizer-model-from-checkpoint-args",
          "--no-use-tokenizer-model-from-checkpoint-args");
  t.flag("--use-mp-args-from-checkpoint-args", a.use_mp_args_from_checkpoint_args,
         "With --use-checkpoint-args, also take the tensor, pipeline (and virtual) and expert "
         "parallel sizes from the checkpoint");
  t.add("--ckpt-step", a.ckpt_step, "Load this iteration instead of the tracker's");
  t.add("--override-ckpt-iteration", a.override_ckpt_iteration,
        "Continue the loaded checkpoint as if it were saved at this iteration: its consumed "
        "samples become iteration x --global-batch-size, so the data replays from there (the "
        "learning-rate schedule keeps the checkpoint's position)");
  t.flag("--async-save", a.async_save,
         "Write checkpoints from a host copy on a background thread while training continues");
  t.flag("--verify-integrity", a.verify_integrity,
         "On load, also check every shard file's SHA-256 against metadata.json (each tensor's "
         "XXH3-64 checksum is checked by default)");
  t.flag("--no-verify-integrity", a.no_verify_integrity,
         "On load, skip the per-tensor checksums (file sizes are still checked)");
  t.add("--ckpt-format", a.ckpt_format,
        "Checkpoint format: torch_dist (the sharded, reshardable format; the only one; "
        "fsdp_dtensor, which Megatron-FSDP asks for, names the same format)");
  t.concern("exit");
  t.flag("--exit-signal-handler", a.exit_signal_handler,
         "On --exit-signal, save a checkpoint at the next iteration boundary and exit (code 3)");
  t.add("--exit-signal", a.exit_signal,
        "Signal for --exit-signal-handler: SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP");
  t.add("--exit-interval", a.exit_interval,
        "Exit (after saving) at the first iteration divisible by this");
  t.add("--exit-duration-in-mins", a.exit_duration_in_mins,
        "Exit (after saving, code 3) once training has run this many minutes");
  t.add("--distributed-timeout-minutes", a.distributed_timeout_minutes,
        "Abort the job when a step or collective makes no progress for this long");
  t.add("--distributed-timeout-seconds-after-init", a.distributed_timeout_seconds_after_init,
        "After the first iteration, the watchdog's limit in seconds instead (Megatron core 0.19 "
        "sets the process groups' timeout to it then): a step, one evaluation iteration or a "
        "checkpoint save (which Megatron's collective timeout does not bound as a whole) "
        "running longer aborts the job; it also arms a watchdog --distributed-timeout-minutes 0 "
        "turned off");
  t.concern("checkpoint");
  t.add("--save-hf", a.save_hf,
        "After training, write the weights as a Hugging Face model directory here");
  t.concern("testing");
  t.add("--inject-fault", a.inject_fault,
        "Testing hook: KIND:RANK:ITERATION makes world rank RANK fail at ITERATION; KIND "
        "'exception' throws at its start, as a failing rank would; 'inf-grad' puts +inf into "
        "one gradient after its backward, as an fp16 overflow would; 'flip-weight' flips a bit "
        "of one weight after its step, as silent memory corruption would");
}

namespace {

void validate_checkpoint_args(const Arguments& a) {
  // Megatron-FSDP needs fsdp_dtensor in Megatron; here every layout writes the same sharded
  // format, which loads into any strategy.
  MEGATRON_CHECK(
      a.ckpt_format == "torch_dist" || (a.ckpt_format == "fsdp_dtensor" && a.use_megatron_fsdp),
      "--ckpt-format ", a.ckpt_format,
      " is not supported: megatron-cpp writes one "
      "format, torch_dist-like sharded checkpoints that load into any layout; drop the "
      "flag");
  MEGATRON_CHECK(a.save_interval >= 0, "--save-interval must be >= 0, got ", a.save_interval);
  MEGATRON_CHECK(a.persistent_save_interval == -1 || a.save_interval == 0 ||
                     a.persistent_save_interval == a.save_interval,
                 "--persistent-save-interval is Megatron's other name of --save-interval: give "
                 "one of them");
  MEGATRON_CHECK(a.non_persistent_ckpt_type.empty() || a.non_persistent_ckpt_type == "global" ||
                     a.non_persistent_ckpt_type == "local",
                 "--non-persistent-ckpt-type must be global or local, got '",
                 a.non_persistent_ckpt_type, "' (Megatron does not support in_memory either)");
  MEGATRON_CHECK(a.non_persistent_ckpt_type != "local",
                 "--non-persistent-ckpt-type local is not implemented: Megatron's local "
                 "checkpoints need NVIDIA's resiliency extension (LocalCheckpointManager); use "
                 "--non-persistent-ckpt-type global, with --non-persistent-global-ckpt-dir on "
                 "fast storage");
  MEGATRON_CHECK(a.non_persistent_save_interval >= 0,
                 "--non-persistent-save-interval must be >= 0, got ",
                 a.non_persistent_save_interval);
  MEGATRON_CHECK(a.non_persistent_save_interval == 0 || !a.non_persistent_ckpt_type.empty(),
                 "--non-persistent-save-interval needs --non-persistent-ckpt-type global (where "
                 "Megatron would fail at the first non-persistent save)");
  if (a.save_retain_interval != 0) {
    MEGATRON_CHECK(a.save_retain_interval > 0 && a.save_interval > 0 &&
                       a.save_retain_interval % a.save_interval == 0,
                   "--save-retain-interval (", a.save_retain_interval,
                   ") must be a positive multiple of --save-interval (", a.save_interval, ")");
  }
  MEGATRON_CHECK(a.exit_interval >= 0, "--exit-interval must be >= 0, got ", a.exit_interval);
  MEGATRON_CHECK(a.exit_duration_in_mins >= 0, "--exit-duration-in-mins must be >= 0, got ",
                 a.exit_duration_in_mins);
  MEGATRON_CHECK(a.distributed_timeout_seconds_after_init >= 0,
                 "--distributed-timeout-seconds-after-init must be positive, got ",
                 a.distributed_timeout_seconds_after_init);
  MEGATRON_CHECK(a.distributed_timeout_minutes >= 0,
                 "--distributed-timeout-minutes must be >= 0 (0: no watchdog), got ",
                 a.distributed_timeout_minutes);
  MEGATRON_CHECK(!a.load_main_params_from_ckpt || !a.load_optim,
                 "--load-main-params-from-ckpt must be used with --no-load-optim (as in "
                 "Megatron): add it");
  MEGATRON_CHECK(!a.use_checkpoint_args || !a.load.empty(),
                 "--use-checkpoint-args needs --load (the checkpoint to take them from)");
  MEGATRON_CHECK(a.ckpt_step < 0 || !a.load.empty(), "--ckpt-step needs --load");
  if (a.override_ckpt_iteration != -1) {
    MEGATRON_CHECK(a.override_ckpt_iteration >= 0,
                   "--override-ckpt-iteration must be an iteration (>= 0), got ",
                   a.override_ckpt_iteration);
    // Megatron's rule and message.
    MEGATRON_CHECK(!a.finetune,
                   "Cannot override checkpoint iteration together with finetune flag "
                   "(--override-ckpt-iteration with --finetune)");
  }
  MEGATRON_CHECK(!a.exit_on_missing_checkpoint || !a.load.empty(),
                 "--exit-on-missing-checkpoint needs --load");
  MEGATRON_CHECK(a.load.empty() || a.pretrained_checkpoint.empty(),
                 "--load and --pretrained-checkpoint both give the starting weights; pass one");
  parse_exit_signal(a.exit_signal);
}

// --context-parallel-size and its comm types (parallel/context_parallel.h), in Megatron's words
// where it has them.
void validate_context_parallel(const Arguments& a) {
  const int64_t cp = a.context_parallel_size, tp = a.tensor_model_parallel_size;
  MEGATRON_CHECK(!a.cp_comm_type.empty(),
                 "--cp-comm-type needs a value: p2p, allgather, a2a or a2a+p2p");
  bool hierarchical = false, heads = false;
  for (const std::string& t : a.cp_comm_type) {
    const CpCommType type = parse_cp_comm_type(t);  // refuses unknown names, naming the flag
    hierarchical = hierarchical || type == CpCommType::kA2AP2P;
    heads = heads || type == CpCommType::kA2A;
  }
  MEGATRON_CHECK(
      a.cp_comm_type.size() == 1 || static_cast<int64_t>(a.cp_comm_type.size()) == a.num_layers,
      "--cp-comm-type takes one value for every layer or one per layer (", a.num_layers,
      " for --num-layers ", a.num_layers, "), got ", a.cp_comm_type.size());
  const auto& sizes = a.hierarchical_context_parallel_sizes;
  MEGATRON_CHECK(!hierarchical || !sizes.empty(),
                 "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes INNER OUTER "
                 "(their product the --context-parallel-size)");
  if (!sizes.empty()) {
    int64_t product = 1;
    for (const std::string& v : sizes) {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      // A level of one is no hierarchy: a2a (OUTER 1) or p2p (INNER 1) does that job.
      MEGATRON_CHECK(end != v.c_str() && *end == '\0' && x >= 2,
                     "--hierarchical-context-parallel-sizes takes sizes of at least 2 (with one "
                     "level use --cp-comm-type a2a or p2p), got '",
                     v, "'");
      product *= x;
    }
    MEGATRON_CHECK(sizes.size() == 2,
                   "--hierarchical-context-parallel-sizes takes two sizes "
                   "(the inner all-to-all level, then the outer ring), got ",
                   sizes.size());
    MEGATRON_CHECK(product == cp,
                   "--hierarchical-context-parallel-sizes must multiply to "
                   "--context-parallel-size (",
                   cp, "), got ", product);
  }
  if (cp == 1) return;
  MEGATRON_CHECK(a.seq_length % (cp * 2) == 0,
                 "seq-length should be a multiple of 2 * context-parallel-size if "
                 "context-parallel-size > 1: --seq-length ",
                 a.seq_length, " is not divisible by 2 x --context-parallel-size = ", 2 * cp,
                 "; choose a multiple of ", 2 * cp);
  MEGATRON_CHECK(!a.sequence_parallel || tp == 1 || (a.seq_length / cp) % tp == 0,
                 "with --sequence-parallel each rank's part of the sequence (--seq-length ",
                 a.seq_length, " / --context-parallel-size ", cp, " = ", a.seq_length / cp,
                 ") must be divisible by --tensor-model-parallel-size (", tp, ")");
  const int64_t groups = a.group_query_attention ? a.num_query_groups : a.num_attention_heads;
  const char* what = a.group_query_attention ? " query groups" : " heads";
  MEGATRON_CHECK(!heads || groups % (tp * cp) == 0,
                 "--cp-comm-type a2a splits the attention heads over the context-parallel ranks: "
                 "the ",
                 groups, what,
                 " must be divisible by --tensor-model-parallel-size x --context-parallel-size = ",
                 tp * cp, "; use p2p or allgather, or change the sizes");
  if (hierarchical) {
    const int64_t inner = std::strtoll(sizes.front().c_str(), nullptr, 10);
    MEGATRON_CHECK(groups % (tp * inner) == 0,
                   "--cp-comm-type a2a+p2p splits the attention heads over the inner level of "
                   "--hierarchical-context-parallel-sizes: the ",
                   groups, what, " must be divisible by --tensor-model-parallel-size x ", inner);
  }
}

// Mixture of Experts against the parallel layout (Megatron's validate_args and MoELayer).
void validate_expert_layout(Arguments& a, int64_t tp) {
  const int64_t ep = a.expert_model_parallel_size;
  if (a.expert_tensor_parallel_size == 0) a.expert_tensor_parallel_size = tp;
  const int64_t etp = a.expert_tensor_parallel_size;
  MEGATRON_CHECK(ep >= 1, "--expert-model-parallel-size must be >= 1, got ", ep);
  MEGATRON_CHECK(etp >= 1, "--expert-tensor-parallel-size must be >= 1, got ", etp);
  MEGATRON_CHECK(ep == 1 || a.num_experts > 0,
                 "num_experts must be non None to use expert model parallelism: "
                 "--expert-model-parallel-size ",
                 ep, " needs --num-experts");
  if (a.num_experts <= 0) {
    MEGATRON_CHECK(a.moe_ffn_hidden_size == 0,
                   "moe_ffn_hidden_size must be None when num_experts is not set: drop "
                   "--moe-ffn-hidden-size or add --num-experts");
    MEGATRON_CHECK(a.moe_latent_size == 0,
                   "MoE latent projections are applicable only for MoE models: "
                   "--moe-latent-size needs --num-experts");
    return;
  }
  MEGATRON_CHECK(a.num_experts % ep == 0,
                 "Number of experts should be a multiple of expert model parallel_size: "
                 "--num-experts ",
                 a.num_experts, " by --expert-model-parallel-size ", ep);
  MEGATRON_CHECK(!(ep > 1 && a.fp16),
                 "Expert parallelism is not supported with fp16 training: use --bf16 with "
                 "--expert-model-parallel-size > 1");
  MEGATRON_CHECK(a.moe_ffn_hidden_size % etp == 0 || a.moe_ffn_hidden_size == 0,
                 "--moe-ffn-hidden-size (", a.moe_ffn_hidden_size,
                 ") must be divisible by --expert-tensor-parallel-size (", etp, ")");
  MEGATRON_CHECK(tp == 1 || a.sequence_parallel,
                 "During training, performance may degrade if MoE and tensor parallelism are "
                 "enabled without also enabling sequence parallelism: add --sequence-parallel "
                 "with --num-experts and --tensor-model-parallel-size ",
                 tp);
  // Expert biases (gpt-oss): fc2's would join partial sums under expert tensor parallelism.
  MEGATRON_CHECK(etp == 1 || a.disable_bias_linear,
                 "MoE expert biases (--add-bias-linear, the default) with "
                 "--expert-tensor-parallel-size ",
                 etp,
                 " (which defaults to --tensor-model-parallel-size) are not implemented: add "
                 "--expert-tensor-parallel-size 1, or --disable-bias-linear");
}

// The tensor- and pipeline-parallel layout: Megatron's rules (validate_args, TransformerConfig,
// the interleaved schedule) in its words, then the flags and numbers involved and the fix. Pure
// arithmetic on the flags and the world size, so every rank reaches the same verdict without
// communicating. Returns the data-parallel size.
int64_t validate_parallel_layout(Arguments& a, int world_size, int rank) {
  // One source of truth for "world size divisible by tp x pp": the grid the trainer builds.
  // Sizes beyond int saturate, so the grid refuses them instead of seeing a wrapped value.
  auto to_int = [](int64_t v) {
    return static_cast<int>(
        std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  };
  ParallelConfig pc;
  pc.tensor_model_parallel_size = to_int(a.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = to_int(a.pipeline_model_parallel_size);
  pc.context_parallel_size = to_int(a.context_parallel_size);
  pc.expert_model_parallel_size = to_int(a.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = to_int(a.expert_tensor_parallel_size);
  pc.num_distributed_optimizer_instances = to_int(a.num_distributed_optimizer_instances);
  if (a.use_tp_pp_dp_mapping) pc.order = "tp-cp-ep-pp-dp";
  const ParallelGrid grid = make_parallel_grid(world_size, pc);
  const int64_t dp = grid.dp;
  validate_context_parallel(a);
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;

  MEGATRON_CHECK(a.num_attention_heads % tp == 0, "num_attention_heads (", a.num_attention_heads,
                 ") must be a multiple of tensor_model_parallel_size (", tp,
                 "): each tensor-parallel rank holds whole heads; choose --num-attention-heads "
                 "and --tensor-model-parallel-size so that ",
                 tp, " divides ", a.num_attention_heads);
  if (a.group_query_attention) {
    MEGATRON_CHECK(a.num_query_groups % tp == 0, "num_query_groups (", a.num_query_groups,
                   ") must be a multiple of tensor_model_parallel_size (", tp,
                   "): each tensor-parallel rank holds whole key/value heads; choose "
                   "--num-query-groups and --tensor-model-parallel-size so that ",
                   tp, " divides ", a.num_query_groups);
  }
  if (a.sequence_parallel && tp == 1) {
    if (rank == 0) {
      log_line(
          "WARNING: Disabling sequence parallelism because tensor model parallelism is disabled "
          "(--sequence-parallel needs --tensor-model-parallel-size > 1)");
    }
    a.sequence_parallel = false;
  }
  validate_expert_layout(a, tp);
  pc.expert_tensor_parallel_size = to_int(a.expert_tensor_parallel_size);
  if (a.use_tp_pp_dp_mapping) pc.order = "tp-cp-ep-pp-dp";
  make_expert_grid(grid, pc);  // EP x ETP must divide each stage's ranks

  const int64_t per_vp = a.num_layers_per_virtual_pipeline_stage;
  const int64_t vp_given = a.num_virtual_stages_per_pipeline_rank;
  MEGATRON_CHECK(per_vp >= 0,
                 "--num-layers-per-virtual-pipeline-stage must be >= 0 (0: none), got ", per_vp);
  MEGATRON_CHECK(vp_given >= 0,
                 "--num-virtual-stages-per-pipeline-rank must be >= 0 (0: none), got ", vp_given);
  MEGATRON_CHECK(per_vp == 0 || vp_given == 0, "--num-layers-per-virtual-pipeline-stage (", per_vp,
                 ") and --num-virtual-stages-per-pipeline-rank (", vp_given,
                 ") cannot be set at the same time; give one of them");
  MEGATRON_CHECK(a.pipeline_model_parallel_layout.empty() || (per_vp == 0 && vp_given == 0),
                 "No more than one of the following arguments can be set at the same time: "
                 "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
                 "--pipeline-model-parallel-layout (the layout sets the virtual stages); drop one");
  const PipelineSplit split = pipeline_split(a);
  if (!split.layout.empty()) {
    const auto stages = static_cast<int64_t>(split.layout.size());
    MEGATRON_CHECK(stages % pp == 0,
                   "The length of pipeline_model_parallel_layout must be divisible by "
                   "pipeline_model_parallel_size: --pipeline-model-parallel-layout has ",
                   stages, " stages, --pipeline-model-parallel-size is ", pp);
  }
  MEGATRON_CHECK(per_vp == 0 || !split.uneven(),
                 "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                 "parallel degree when enable uneven pipeline parallelism "
                 "(--decoder-first/last-pipeline-num-layers); drop "
                 "--num-layers-per-virtual-pipeline-stage");
  // The layers (and the embedding / loss where the split counts them) per pipeline rank.
  const int64_t units = split_units(a.num_layers, split);
  // One virtual stage per rank is no interleaving (Megatron sets the virtual size to None then).
  const bool interleaved = (per_vp > 0 && per_vp * pp != units) || vp_given > 1 ||
                           static_cast<int64_t>(split.layout.size()) > pp;
  MEGATRON_CHECK(!interleaved || pp > 1,
                 "When interleaved schedule is used, pipeline-model-parallel size should be "
                 "greater than 1: ",
                 per_vp > 0     ? "--num-layers-per-virtual-pipeline-stage"
                 : vp_given > 0 ? "--num-virtual-stages-per-pipeline-rank"
                                : "--pipeline-model-parallel-layout with several stages",
                 " needs --pipeline-model-parallel-size >= 2, got ", pp,
                 "; raise it or drop the flag");
  // (A layout gives its virtual stages itself: checked with them below.)
  if (split.layout.empty()) validate_pipeline_split(a.num_layers, pp, 1, split);
  if (per_vp > 0) {
    MEGATRON_CHECK((units / pp) % per_vp == 0,
                   "number of layers per pipeline stage must be divisible by number of layers per "
                   "virtual pipeline stage: --num-layers (",
                   a.num_layers, ") / --pipeline-model-parallel-size (", pp, ") = ", units / pp,
                   " layers per stage, not a multiple of --num-layers-per-virtual-pipeline-stage (",
                   per_vp, ")");
  }
  if (vp_given > 0 && !split.uneven()) {
    MEGATRON_CHECK(
        (units / pp) % vp_given == 0,
        "number of layers per pipeline stage must be divisible by the number of virtual "
        "stages: --num-layers (",
        a.num_layers, ") / --pipeline-model-parallel-size (", pp, ") = ", units / pp,
        " layers per stage cannot be split into --num-virtual-stages-per-pipeline-rank (", vp_given,
        ") chunks; --num-layers must be a multiple of ", pp * vp_given);
  }
  validate_pipeline_split(a.num_layers, pp, virtual_pipeline_stages(a), split);
  return dp;
}

// Iteration- or sample-based training (Megatron's validate_args rules, in its words, but for the
// ramp-up with --train-iters, which runs) and the
// batch schedule: every global batch it runs splits into micro-batch x data-parallel pieces (and
// into a multiple of the pipeline size when interleaving). Sample-based training sets
// --train-iters from the schedule, as Megatron's update_train_iters does.
void validate_batch_schedule(Arguments& a, int64_t dp) {
  const bool by_samples = a.train_samples > 0;
  MEGATRON_CHECK(a.train_iters >= 0 && a.train_samples >= 0,
                 "--train-iters and --train-samples must be positive");
  MEGATRON_CHECK(a.train_iters > 0 || by_samples,
                 "either --train-iters or --train-samples is required (a positive integer)");
  if (!by_samples) {
    MEGATRON_CHECK(a.lr_decay_samples == 0,
                   "expected iteration-based learning rate decay: --lr-decay-samples needs "
                   "--train-samples (with --train-iters use --lr-decay-iters)");
    MEGATRON_CHECK(a.lr_warmup_samples == 0,
                   "expected iteration-based learning rate warmup: --lr-warmup-samples needs "
                   "--train-samples (with --train-iters use --lr-warmup-iters)");
    MEGATRON_CHECK(a.lr_wsd_decay_samples == 0,
                   "--lr-wsd-decay-samples needs --train-samples (with --train-iters use "
                   "--lr-wsd-decay-iters)");
    // Megatron r0.14 asserts against --rampup-batch-size with --train-iters, yet its own GPT-3
    // example passes both; here the pair runs (see Trainer: --train-iters iterations, each with
    // the ramp-up's batch).
  } else {
    MEGATRON_CHECK(a.train_iters == 0,
                   "expected sample-based training: give --train-iters or --train-samples, not "
                   "both");
    MEGATRON_CHECK(a.lr_decay_iters == 0,
                   "expected sample-based learning rate decay: with --train-samples use "
                   "--lr-decay-samples instead of --lr-decay-iters");
    MEGATRON_CHECK(a.lr_warmup_iters == 0,
                   "expected sample-based learning rate warmup: with --train-samples use "
                   "--lr-warmup-samples instead of --lr-warmup-iters");
    MEGATRON_CHECK(a.lr_wsd_decay_iters == 0,
                   "with --train-samples use --lr-wsd-decay-samples instead of "
                   "--lr-wsd-decay-iters");
    MEGATRON_CHECK(!(a.lr_warmup_fraction >= 0 && a.lr_warmup_samples > 0),
                   "can only specify one of --lr-warmup-fraction and --lr-warmup-samples");
  }
  // Megatron core 0.19's evaluation batch sizes: the training ones unless given.
  MEGATRON_CHECK(a.eval_micro_batch_size >= 0 && a.eval_global_batch_size >= 0,
                 "--eval-micro-batch-size and --eval-global-batch-size must be positive");
  // Checked when either is given (the training sizes are checked, or decreased with
  // --decrease-batch-size-if-needed, by the batch schedule below; the evaluation then takes
  // whole micro-batches of them, as before these flags).
  const bool eval_sizes_given = a.eval_micro_batch_size > 0 || a.eval_global_batch_size > 0;
  if (a.eval_micro_batch_size == 0) a.eval_micro_batch_size = a.micro_batch_size;
  if (a.eval_global_batch_size == 0) a.eval_global_batch_size = a.global_batch_size;
  MEGATRON_CHECK(
      !eval_sizes_given || a.eval_global_batch_size % (a.eval_micro_batch_size * dp) == 0,
      "--eval-global-batch-size (", a.eval_global_batch_size,
      "; default --global-batch-size) must be divisible by --eval-micro-batch-size (",
      a.eval_micro_batch_size,
      "; default --micro-batch-size) times the data-parallel "
      "size (",
      dp, ")");
  MEGATRON_CHECK(a.start_eval_at_iter >= 0, "--start-eval-at-iter must be >= 0, got ",
                 a.start_eval_at_iter);
  MEGATRON_CHECK(a.validation_set_names.empty() || a.multiple_validation_sets,
                 "--validation-set-names names the sets of --multiple-validation-sets: add it "
                 "(with --full-validation) or drop the names");
  std::optional<BatchRampup> rampup;
  if (!a.rampup_batch_size.empty()) rampup = parse_rampup_batch_size(a.rampup_batch_size);
  const BatchSchedule schedule(a.global_batch_size, a.micro_batch_size, dp,
                               a.decrease_batch_size_if_needed, rampup);
  MEGATRON_CHECK(a.microbatch_group_size_per_vp_stage >= 0,
                 "--microbatch-group-size-per-virtual-pipeline-stage must be positive, got ",
                 a.microbatch_group_size_per_vp_stage);
  if (virtual_pipeline_stages(a) > 1 && a.microbatch_group_size_per_vp_stage > 0) {
    // Megatron's checks of the group (every batch of a ramp-up too), naming the flag.
    for (const BatchSchedule::Batch& b : schedule.all_batches()) {
      validate_interleaving(static_cast<int>(a.pipeline_model_parallel_size),
                            static_cast<int>(b.microbatches),
                            static_cast<int>(virtual_pipeline_stages(a)),
                            static_cast<int>(a.microbatch_group_size_per_vp_stage));
    }
  } else if (virtual_pipeline_stages(a) > 1) {
    const int64_t pp = a.pipeline_model_parallel_size;
    for (const BatchSchedule::Batch& b : schedule.all_batches()) {
      MEGATRON_CHECK(b.microbatches % pp == 0, "number of microbatches (", b.microbatches,
                     ") is not divisible by pipeline-model-parallel-size (", pp,
                     ") when using interleaved schedule: ",
                     rampup ? "global batch size " + std::to_string(b.running) +
                                  " (a step of --rampup-batch-size)"
                            : "--global-batch-size (" + std::to_string(b.running) + ")",
                     " / (--micro-batch-size (", a.micro_batch_size, ") x data parallel size (", dp,
                     ")); choose batch sizes giving a multiple of ", pp, " micro-batches");
    }
  }
  for (const std::string& v : a.iterations_to_skip) {
    char* end = nullptr;
    const long long it = std::strtoll(v.c_str(), &end, 10);
    MEGATRON_CHECK(end != v.c_str() && *end == '\0' && it >= 0,
                   "--iterations-to-skip takes iteration numbers >= 0, got '", v, "'");
  }
  if (by_samples) {
    a.train_iters = schedule.iterations_for(a.train_samples);
    MEGATRON_CHECK(a.train_iters > 0, "--train-samples (", a.train_samples,
                   ") is less than one global batch (", a.global_batch_size, ")");
  }
  a.phase_transitions.clear();
  if (!a.phase_transition_iterations.empty()) {
    std::stringstream list(a.phase_transition_iterations);
    for (std::string item; std::getline(list, item, ',');) {
      char* end = nullptr;
      const long long it = std::strtoll(item.c_str(), &end, 10);
      while (end && *end == ' ') ++end;
      MEGATRON_CHECK(end != item.c_str() && *end == '\0' && it > 0,
                     "--phase-transition-iterations takes comma-separated iterations > 0, got '",
                     a.phase_transition_iterations, "'");
      a.phase_transitions.push_back(it);
    }
    std::sort(a.phase_transitions.begin(), a.phase_transitions.end());
    // A transition at or past the end changes nothing: the run ends there anyway.
    std::erase_if(a.phase_transitions, [&](int64_t t) { return t >= a.train_iters; });
    MEGATRON_CHECK(!rampup && !a.decrease_batch_size_if_needed,
                   "--phase-transition-iterations needs a constant global batch size across "
                   "phases (a phase's samples are its iterations x --global-batch-size); drop ",
                   rampup ? "--rampup-batch-size" : "--decrease-batch-size-if-needed");
    for (const std::string& v : a.iterations_to_skip) {
      // Megatron counts a skipped iteration before its step: skipping N skips iteration N + 1.
      const int64_t skipped = std::strtoll(v.c_str(), nullptr, 10) + 1;
      MEGATRON_CHECK(std::find(a.phase_transitions.begin(), a.phase_transitions.end(), skipped) ==
                         a.phase_transitions.end(),
                     "--iterations-to-skip ", v, " skips iteration ", skipped,
                     ", a --phase-transition-iterations transition, where the job must save and "
                     "exit; skip another iteration");
    }
  }
}

// The weight-decay increment and the decoupled learning rate (Megatron's validate_args and
// OptimizerParamScheduler rules); a constant style sets both ends to --weight-decay.
void validate_optimizer_schedules(Arguments& a) {
  MEGATRON_CHECK(!(a.override_opt_param_scheduler && a.use_checkpoint_opt_param_scheduler),
                 "both override and use-checkpoint are set: --override-opt_param-scheduler keeps "
                 "this run's schedule, --use-checkpoint-opt_param-scheduler takes the "
                 "checkpoint's; give one of them");
  parse_weight_decay_incr_style(a.weight_decay_incr_style);
  const bool ends = is_set(a.start_weight_decay) || is_set(a.end_weight_decay);
  if (a.weight_decay_incr_style == "constant") {
    MEGATRON_CHECK(!ends,
                   "--start-weight-decay and --end-weight-decay need --weight-decay-incr-style "
                   "linear or cosine (with the constant style the decay is --weight-decay)");
    a.start_weight_decay = a.end_weight_decay = a.weight_decay;
  } else {
    MEGATRON_CHECK(is_set(a.start_weight_decay) && is_set(a.end_weight_decay),
                   "--weight-decay-incr-style ", a.weight_decay_incr_style,
                   " needs --start-weight-decay and --end-weight-decay");
    MEGATRON_CHECK(a.start_weight_decay >= 0 && a.end_weight_decay >= a.start_weight_decay,
                   "the weight decay increases: need 0 <= --start-weight-decay (",
                   a.start_weight_decay, ") <= --end-weight-decay (", a.end_weight_decay, ")");
  }
  if (is_set(a.decoupled_lr)) {
    const double min = is_set(a.decoupled_min_lr) ? a.decoupled_min_lr : a.min_lr;
    MEGATRON_CHECK(a.decoupled_lr >= 0 && min >= 0 && min <= a.decoupled_lr, "--decoupled-min-lr (",
                   min, is_set(a.decoupled_min_lr) ? "" : ", from --min-lr",
                   ") must be in [0, --decoupled-lr = ", a.decoupled_lr, "]");
    MEGATRON_CHECK(a.lr_warmup_init <= a.decoupled_lr, "--lr-warmup-init (", a.lr_warmup_init,
                   ") must not exceed --decoupled-lr (", a.decoupled_lr, ")");
  }
}

// Megatron's activation-recomputation rules (TransformerConfig.__post_init__, and its
// --recompute-activations alias), with the flags named. per_stage: layers per pipeline stage.
void validate_recompute(Arguments& a, int64_t per_stage) {
  std::string& granularity = a.recompute_granularity;
  MEGATRON_CHECK(granularity.empty() || granularity == "full" || granularity == "selective",
                 "--recompute-granularity must be full or selective, got '", granularity, "'");
  MEGATRON_CHECK(a.recompute_method.empty() || a.recompute_method == "uniform" ||
                     a.recompute_method == "block",
                 "--recompute-method must be uniform or block, got '", a.recompute_method, "'");
  if (a.distribute_saved_activations) {  // Megatron's assertions
    MEGATRON_CHECK(a.tensor_model_parallel_size > 1,
                   "--distribute-saved-activations: can distribute recomputed activations only "
                   "across tensor model parallel groups (--tensor-model-parallel-size > 1)");
    MEGATRON_CHECK(granularity == "full",
                   "--distribute-saved-activations is only applicable to --recompute-granularity "
                   "full");
    MEGATRON_CHECK(!a.recompute_method.empty(),
                   "--distribute-saved-activations needs a --recompute-method (uniform or block)");
    MEGATRON_CHECK(!a.sequence_parallel,
                   "--distribute-saved-activations must be false when sequence parallel is "
                   "enabled (--sequence-parallel)");
  }
  if (a.recompute_activations) {
    MEGATRON_CHECK(granularity != "full",
                   "--recompute-activations (deprecated alias of --recompute-granularity "
                   "selective) contradicts --recompute-granularity full; drop one of them");
    granularity = "selective";
  }
  if (a.moe_layer_recompute) {  // Megatron's deprecated flag: selective with "moe" added
    MEGATRON_CHECK(granularity != "full",
                   "Do not set --moe-layer-recompute with full recompute granularity: drop one");
    granularity = "selective";
    if (a.recompute_modules.empty()) a.recompute_modules = {"core_attn"};
    if (std::find(a.recompute_modules.begin(), a.recompute_modules.end(), "moe") ==
        a.recompute_modules.end())
      a.recompute_modules.push_back("moe");
  }
  for (const std::string& m : a.recompute_modules) {
    MEGATRON_CHECK(m == "core_attn" || m == "mlp" || m == "moe" || m == "shared_experts" ||
                       m == "moe_act" || m == "mla_up_proj" || m == "layernorm",
                   "--recompute-modules: invalid choice '", m,
                   "'; allowed: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
                   "shared_experts");
  }
  if (granularity == "selective") {
    const auto has = [&](const char* m) {
      return std::find(a.recompute_modules.begin(), a.recompute_modules.end(), m) !=
             a.recompute_modules.end();
    };
    MEGATRON_CHECK(!has("moe_act") || a.moe_grouped_gemm,
                   "moe_act in recompute_modules is only supported with moe_grouped_gemm: add "
                   "--moe-grouped-gemm (as Megatron requires)");
    MEGATRON_CHECK(!has("mla_up_proj") || a.multi_latent_attention,
                   "mla_up_proj in recompute_modules is only supported with "
                   "multi_latent_attention (--multi-latent-attention)");
    MEGATRON_CHECK(!has("shared_experts") || !a.moe_shared_expert_overlap,
                   "shared_experts recompute cannot work with --moe-shared-expert-overlap: drop "
                   "one");
    const bool beyond_core = std::any_of(a.recompute_modules.begin(), a.recompute_modules.end(),
                                         [](const std::string& m) { return m != "core_attn"; });
    MEGATRON_CHECK(!beyond_core || a.fp8_format.empty(),
                   "--recompute-modules other than core_attn with --fp8-format is not implemented "
                   "yet (the recomputed GEMMs would quantise again): keep core_attn only, or "
                   "drop FP8");
  }
  MEGATRON_CHECK(a.recompute_method.empty() || granularity == "full",
                 "--recompute-method requires --recompute-granularity full",
                 granularity == "selective"
                     ? " (selective recomputation, the core attention of every layer, takes no "
                       "method); drop --recompute-method or use --recompute-granularity full"
                     : "; add --recompute-granularity full or drop --recompute-method");
  if (granularity == "full") {
    MEGATRON_CHECK(!a.recompute_method.empty(),
                   "Using recompute_granularity: full so recompute_method must be \"block\" or "
                   "\"uniform\": add --recompute-method uniform or --recompute-method block");
    const int64_t n = a.recompute_num_layers;
    MEGATRON_CHECK(n >= 1 && (a.recompute_method == "uniform" || n <= per_stage),
                   "When using recompute_granularity: full recompute_num_layers must be between 1 "
                   "and num_layers_per_pipeline_rank: ",
                   per_stage,
                   " (--num-layers / --pipeline-model-parallel-size), got --recompute-num-layers ",
                   n, n < 1 ? " (give it)" : "");
  } else if (granularity == "selective") {
    MEGATRON_CHECK(a.recompute_num_layers == 0,
                   "When using recompute_granularity: selective recompute_num_layers must be None: "
                   "drop --recompute-num-layers (",
                   a.recompute_num_layers, ")");
  } else {
    MEGATRON_CHECK(a.recompute_num_layers == 0, "--recompute-num-layers (", a.recompute_num_layers,
                   ") requires --recompute-granularity full");
  }
}

// Hybrid Mamba models (--model mamba, Megatron's pretrain_mamba.py and core 0.19's
// pretrain_hybrid.py) and --spec.
void validate_hybrid_args(const Arguments& a) {
  // r0.14's module and core 0.19's (megatron.core.models.hybrid, which keeps mamba_stack_spec
  // as an alias of hybrid_stack_spec): the same stack.
  const std::string hybrid_module = "megatron.core.models.hybrid.hybrid_layer_specs";
  const bool hybrid_spec =
      a.spec == std::vector<std::string>{"megatron.core.models.mamba.mamba_layer_specs",
                                         "mamba_stack_spec"} ||
      a.spec == std::vector<std::string>{hybrid_module, "hybrid_stack_spec"} ||
      a.spec == std::vector<std::string>{hybrid_module, "mamba_stack_spec"};
  const bool local = a.spec == std::vector<std::string>{"local"};
  std::string given;
  for (const std::string& v : a.spec) given += (given.empty() ? "" : " ") + v;
  MEGATRON_CHECK(a.spec.empty() || hybrid_spec || local, "--spec '", given,
                 "': Python module specs cannot be loaded here; the layers are given by --model "
                 "(gpt: Megatron's local GPT spec; mamba: megatron.core.models.mamba."
                 "mamba_layer_specs mamba_stack_spec or megatron.core.models.hybrid."
                 "hybrid_layer_specs hybrid_stack_spec): drop --spec");
  MEGATRON_CHECK(!hybrid_spec || a.model == "mamba", "--spec ", given,
                 " is the hybrid Mamba stack: use `megatron pretrain_hybrid` or `megatron "
                 "pretrain_mamba` (--model mamba)");
  MEGATRON_CHECK(
      !local || a.model != "mamba",
      "--spec local is a GPT layer spec; `megatron pretrain_hybrid` (pretrain_mamba) takes "
      "megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec (or no "
      "--spec)");
  const bool hybrid_flags = a.hybrid_attention_ratio != 0.0 || a.hybrid_mlp_ratio != 0.0 ||
                            !a.hybrid_override_pattern.empty() || !a.hybrid_layer_pattern.empty() ||
                            a.is_hybrid_model;
  MEGATRON_CHECK(!hybrid_flags || a.model == "mamba",
                 "--hybrid-attention-ratio, --hybrid-mlp-ratio, --hybrid-layer-pattern, "
                 "--hybrid-override-pattern and --is-hybrid-model shape hybrid Mamba models: use "
                 "`megatron pretrain_hybrid` or `megatron pretrain_mamba` (--model mamba), not "
                 "--model ",
                 a.model);
  if (a.model != "mamba") return;
  MEGATRON_CHECK(a.device != "cuda",
                 "--device cuda with --model mamba: the Mamba layers' scan runs on the CPU only "
                 "here; use --device cpu");
  MEGATRON_CHECK(!a.multi_latent_attention,
                 "--multi-latent-attention with --model mamba is not implemented (Megatron "
                 "r0.14's hybrid attention layers are standard self-attention)");
}

}  // namespace

std::vector<std::string> resolve_hybrid_pattern(Arguments& a) {
  std::vector<std::string> notes;
  a.hybrid_pipeline_segments.clear();
  if (a.model != "mamba") return notes;  // validate_hybrid_args refuses the flags elsewhere
  const std::string flag = hybrid_pattern_flag(a);
  // Megatron refuses both spellings together; equal values are accepted here (a checkpoint's
  // record from before the new spelling restores the old one beside a given new one).
  MEGATRON_CHECK(a.hybrid_layer_pattern.empty() || a.hybrid_override_pattern.empty() ||
                     a.hybrid_layer_pattern == a.hybrid_override_pattern,
                 "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified: "
                 "--hybrid-override-pattern is deprecated; keep --hybrid-layer-pattern");
  const std::string text = hybrid_pattern_text(a);
  if (text.empty()) return notes;
  const HybridPattern p = parse_hybrid_pattern(text, flag);
  const auto layers = static_cast<int64_t>(p.main.size());
  // Only an MTP part (the legacy MTP pattern beside the ratios): the ratios allocate the layers.
  if (layers == 0 && !p.has_pipes()) {
    if (!p.mtp.empty()) a.mtp_num_layers = p.mtp_depths;
    return notes;
  }
  if (a.num_layers != 0 && a.num_layers != layers) {
    notes.push_back(flag + " is set; ignoring --num-layers (" + std::to_string(a.num_layers) +
                    ") and using the layer count derived from the pattern (" +
                    std::to_string(layers) + ")");
  }
  a.num_layers = layers;
  if (!p.mtp.empty()) {
    if (a.mtp_num_layers != 0 && a.mtp_num_layers != p.mtp_depths) {
      notes.push_back("--mtp-num-layers (" + std::to_string(a.mtp_num_layers) +
                      ") conflicts with the MTP depth count (" + std::to_string(p.mtp_depths) +
                      ") in the pattern '" + text + "'; using the pattern's");
    }
    a.mtp_num_layers = p.mtp_depths;
  }
  if (!p.has_pipes()) return notes;
  // Megatron's assertions beside '|': the segments are the pipeline layout, so nothing else may
  // give one. (Megatron refuses the virtual-stage, layout and account-for flags beside any
  // hybrid pattern; here they stay allowed without '|', an extension: any split of the layers.)
  auto refuse_beside_pipes = [&](bool given, const char* other, const char* why) {
    MEGATRON_CHECK(!given, "If ", flag, " contains pipe separators, ", other,
                   " should not be specified ", why);
  };
  const char* explicit_layout = "as the pipeline layout is explicitly defined";
  refuse_beside_pipes(a.decoder_first_pipeline_num_layers > 0,
                      "--decoder-first-pipeline-num-layers", explicit_layout);
  refuse_beside_pipes(a.decoder_last_pipeline_num_layers > 0, "--decoder-last-pipeline-num-layers",
                      explicit_layout);
  refuse_beside_pipes(a.num_layers_per_virtual_pipeline_stage > 0,
                      "--num-layers-per-virtual-pipeline-stage",
                      "(the virtual stages are the pattern's segments)");
  refuse_beside_pipes(a.num_virtual_stages_per_pipeline_rank > 0,
                      "--num-virtual-stages-per-pipeline-rank",
                      "(the virtual stages are the pattern's segments)");
  refuse_beside_pipes(!a.pipeline_model_parallel_layout.empty(), "--pipeline-model-parallel-layout",
                      explicit_layout);
  refuse_beside_pipes(a.account_for_embedding_in_pipeline_split,
                      "--account-for-embedding-in-pipeline-split", explicit_layout);
  refuse_beside_pipes(a.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split",
                      explicit_layout);
  const auto segments = static_cast<int64_t>(p.segments.size());
  const int64_t pp = std::max<int64_t>(1, a.pipeline_model_parallel_size);
  if (pp == 1) {
    // No pipeline: nothing to lay out (Megatron would ask for interleaving over one rank and
    // refuse it). Accepted so that a checkpoint of a pipelined run resumes in one process.
    notes.push_back(flag + " '" + text + "' has " + std::to_string(segments) +
                    " pipeline segments ('|'); at --pipeline-model-parallel-size 1 they run as "
                    "one stage");
    return notes;
  }
  MEGATRON_CHECK(segments % pp == 0, "The number of hybrid pipeline segments described by ", flag,
                 " must be evenly divisible by --pipeline-model-parallel-size. Got ", segments,
                 " segments and ", pp,
                 " pipeline parallel size (a checkpoint's pattern gives way to a given "
                 "--hybrid-layer-pattern with the same layers: give one with '|' for this "
                 "layout)");
  a.hybrid_pipeline_segments = p.segments;
  return notes;
}

void validate_train_args(Arguments& a, int world_size, int rank) {
  for (const std::string& note : resolve_hybrid_pattern(a))
    if (rank == 0) log_line("WARNING: " + note);
  if (a.persistent_save_interval != -1 && a.save_interval == 0)
    a.save_interval = a.persistent_save_interval;
  FaultInjection::parse(a.inject_fault);  // a malformed testing hook fails before the dump
  model_spec(a.model);                    // an unknown --model, with the known ones
  validate_checkpoint_args(a);
  MEGATRON_CHECK(!(a.fp16 && a.bf16), "--fp16 and --bf16 are mutually exclusive; pick one");
  MEGATRON_CHECK(!(a.verify_integrity && a.no_verify_integrity),
                 "--verify-integrity and --no-verify-integrity are mutually exclusive; pick one");
  MEGATRON_CHECK(!a.fp32_residual_connection || a.fp16 || a.bf16,
                 "residual connection in fp32 only supported when using fp16 or bf16: "
                 "--fp32-residual-connection needs --fp16 or --bf16");
  MEGATRON_CHECK(!(a.qk_l2_norm && a.multi_latent_attention),
                 "qk_l2_norm is not supported with MLA: drop --qk-l2-norm or "
                 "--multi-latent-attention");
  MEGATRON_CHECK((!a.qk_l2_norm && a.no_rope_freq.empty()) || a.model == "gpt",
                 "--qk-l2-norm and --no-rope-freq are implemented for --model gpt only");
  MEGATRON_CHECK(a.mtp_num_layers == 0 || a.recompute_granularity != "full" ||
                     a.recompute_method != "uniform" || a.recompute_num_layers == 1,
                 "recompute_num_layers must be 1 for MTP recompute (Megatron: --mtp-num-layers "
                 "with --recompute-granularity full --recompute-method uniform needs "
                 "--recompute-num-layers 1)");
  MEGATRON_CHECK(a.no_rope_freq.empty() || !a.multi_latent_attention,
                 "--no-rope-freq does not apply to --multi-latent-attention (its rotary "
                 "channels turn on every layer, as in Megatron): drop one");
  MEGATRON_CHECK(a.no_rope_freq.empty() || a.mtp_num_layers == 0,
                 "--no-rope-freq with --mtp-num-layers: the pattern has no entry for the "
                 "prediction layers (Megatron indexes past its end); drop one");
  MEGATRON_CHECK(!a.multi_latent_attention || a.model == "gpt",
                 "--multi-latent-attention is implemented for --model gpt (Megatron's GPTModel), "
                 "not ",
                 a.model);
  if (a.mtp_num_layers > 0) {
    MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                   "--mtp-num-layers: multi-token prediction is implemented for --model gpt "
                   "(Megatron's GPTModel) and mamba (its hybrid model), not ",
                   a.model);
  }
  MEGATRON_CHECK(!a.attention_output_gate || a.model == "gpt" || a.model == "mamba",
                 "--attention-output-gate is implemented for --model gpt and mamba (Megatron's "
                 "GPT and hybrid self-attention; it has no cross-attention form), not ",
                 a.model);
  MEGATRON_CHECK(!(a.attention_output_gate || a.moe_shared_expert_gate) || a.device != "cuda",
                 "--attention-output-gate and --moe-shared-expert-gate run on the CPU only: drop "
                 "--device cuda or the gate");
  MEGATRON_CHECK(
      !(a.attention_output_gate && a.qk_clip),
      "--qk-clip rescales linear_qkv's query and key rows, which --attention-output-gate "
      "interleaves with its gates (not supported together here, nor checked by "
      "Megatron): drop one");
  if (a.use_mup) {
    MEGATRON_CHECK(a.mup_base_hidden_size >= 0,
                   "mup_base_hidden_size must be positive: --mup-base-hidden-size ",
                   a.mup_base_hidden_size);
    MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                   "--use-mup is implemented for --model gpt and mamba (Megatron's GPT and "
                   "hybrid models), not ",
                   a.model);
    MEGATRON_CHECK(a.optimizer != "onebit_adam",
                   "--use-mup with --optimizer onebit_adam: 1-bit Adam has no per-group rates; use "
                   "adam, sgd, muon or lion");
    if (a.mup_base_hidden_size == 0) a.mup_base_hidden_size = a.hidden_size;
    a.mup_width_mult = static_cast<double>(a.hidden_size) /
                       static_cast<double>(a.mup_base_hidden_size);  // Megatron's, printed
  }
  validate_hybrid_args(a);
  validate_heterogeneous_args(a);
  if (a.moe_use_upcycling) {
    MEGATRON_CHECK(!a.save.empty(),
                   "When using upcycling, the --save option must be specified "
                   "(--moe-use-upcycling writes the MoE checkpoint there)");
    MEGATRON_CHECK(!a.load.empty(), "--moe-use-upcycling needs --load: the dense checkpoint");
    MEGATRON_CHECK(a.num_experts > 0, "--moe-use-upcycling needs --num-experts");
    // Megatron's validate_args: the upcycled checkpoint has no optimizer or RNG state.
    if (a.load_optim && rank == 0) log_line("Warning: disabling --no-load-optim for upcycling.");
    if (a.load_rng && rank == 0) log_line("Warning: disabling --no-load-rng for upcycling.");
    a.load_optim = a.load_rng = false;
  }
  MEGATRON_CHECK(!(a.squared_relu && a.swiglu),
                 "--squared-relu and --swiglu are two MLP activations; pick one");
  MEGATRON_CHECK(!(a.squared_relu && a.openai_gelu),
                 "--squared-relu and --openai-gelu are two MLP activations; pick one");
  MEGATRON_CHECK(a.loss_scale >= 0,
                 "--loss-scale must be positive (or unset for dynamic "
                 "scaling), got ",
                 a.loss_scale);
  MEGATRON_CHECK(
      a.initial_loss_scale > 0 && a.min_loss_scale > 0 && a.min_loss_scale <= a.initial_loss_scale,
      "--min-loss-scale (", a.min_loss_scale, ") and --initial-loss-scale (", a.initial_loss_scale,
      ") must be positive, the minimum not above the initial");
  MEGATRON_CHECK(a.loss_scale_window > 0, "--loss-scale-window must be positive, got ",
                 a.loss_scale_window);
  MEGATRON_CHECK(a.hysteresis > 0, "--hysteresis must be positive, got ", a.hysteresis);
  const bool per_split =
      !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  MEGATRON_CHECK(a.mock_data || !a.data_path.empty() || per_split || !a.train_data.empty(),
                 "no training data: pass --data-path (or --train-data-path) or --mock-data");
  MEGATRON_CHECK(!(a.mock_data && (!a.data_path.empty() || per_split)),
                 "--mock-data and --data-path/--train-data-path are mutually exclusive");
  MEGATRON_CHECK(!(!a.data_path.empty() && per_split),
                 "--data-path and --train-data-path/--valid-data-path/--test-data-path are "
                 "mutually exclusive");
  MEGATRON_CHECK(a.eval_interval > 0, "--eval-interval must be positive, got ", a.eval_interval);
  MEGATRON_CHECK(a.eval_iters >= 0, "--eval-iters must be >= 0, got ", a.eval_iters);
  MEGATRON_CHECK(a.num_workers >= 0, "--num-workers must be >= 0, got ", a.num_workers);
  if (a.dataloader_inter_document_masking) {
    MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                   "--dataloader-inter-document-masking masks GPT samples by their documents "
                   "(--model gpt or mamba), not --model ",
                   a.model);
    if (a.sft) {  // Megatron's SFT samples are one conversation each, whatever the flag says
      if (rank == 0) log_line("WARNING: --dataloader-inter-document-masking is ignored with --sft");
      a.dataloader_inter_document_masking = false;
    }
  }
  if (a.fim_data) {
    MEGATRON_CHECK(!a.mock_data,
                   "--fim-data permutes real documents: mock data is not supported with the FIM "
                   "dataset (as in Megatron); pass --data-path");
    MEGATRON_CHECK(a.fim_rate > 0,
                   "--fim-rate should be specified (a probability above 0, as Megatron asserts; "
                   "without FIM drop --fim-data)");
    // pretrain_gpt.py builds the SFT dataset before it looks at --fim-data.
    if (a.sft) {
      if (rank == 0) log_line("WARNING: --fim-data is ignored with --sft, as in Megatron");
      a.fim_data = false;
    } else {
      MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                     "--fim-data permutes GPT samples (--model gpt or mamba), not --model ",
                     a.model);
      MEGATRON_CHECK(a.tokenizer_type == "HuggingFaceTokenizer",
                     "--fim-data decodes and re-encodes samples with a Hugging Face tokenizer "
                     "that has the FIM tokens: pass --tokenizer-type HuggingFaceTokenizer "
                     "--tokenizer-model DIR (got --tokenizer-type ",
                     a.tokenizer_type, ")");
      validate_fim_config(data_config(a).fim);
    }
  }
  if (a.sft) {
    MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                   "--sft trains GPT and hybrid Mamba models (--model gpt or mamba), not --model ",
                   a.model);
    MEGATRON_CHECK(a.tokenizer_type == "SFTTokenizer",
                   "--sft tokenizes conversations with --tokenizer-type SFTTokenizer (a Hugging "
                   "Face tokenizer.json with --tokenizer-model), got ",
                   a.tokenizer_type);
    MEGATRON_CHECK(!a.mock_data,
                   "--sft reads conversations: pass --data-path (a JSON-lines "
                   "file), not --mock-data");
    // Megatron's SFTDataset asserts both off; its size comes from the iterations.
    MEGATRON_CHECK(!a.reset_position_ids && !a.reset_attention_mask,
                   "--sft samples are one conversation each: drop --reset-position-ids and "
                   "--reset-attention-mask");
    MEGATRON_CHECK(!a.full_validation,
                   "--full-validation needs a dataset of one epoch, which "
                   "Megatron's SFT dataset does not define: drop it with --sft");
  }
  MEGATRON_CHECK(!a.multiple_validation_sets || a.full_validation,
                 "--multiple-validation-sets currently requires --full-validation (as in "
                 "Megatron): add it");
  if (a.full_validation) {
    MEGATRON_CHECK(a.model == "gpt" || a.model == "mamba",
                   "--full-validation is implemented for GPT datasets "
                   "(--model gpt or mamba) only; drop it for --model ",
                   a.model);
    MEGATRON_CHECK(!a.mock_data,
                   "--full-validation evaluates one epoch of the validation data, "
                   "which --mock-data does not have: pass --data-path or --valid-data-path");
  }
  MEGATRON_CHECK(a.dataloader_type == "single" || a.dataloader_type == "cyclic",
                 "--dataloader-type must be single or cyclic, got '", a.dataloader_type,
                 "' (external needs a Python data iterator, which a command line cannot give)");
  // Megatron's legacy RoPE arguments.
  if (a.use_rotary_position_embeddings) a.position_embedding_type = "rope";
  MEGATRON_CHECK(a.add_position_embedding || a.position_embedding_type == "rope",
                 "--no-position-embedding is deprecated, use --position-embedding-type (none for "
                 "no position embedding)");
  MEGATRON_CHECK(a.num_layers > 0, "--num-layers is required (a positive integer)");
  MEGATRON_CHECK(a.hidden_size > 0, "--hidden-size is required (a positive integer)");
  MEGATRON_CHECK(a.num_attention_heads > 0,
                 "--num-attention-heads is required (a positive integer)");
  MEGATRON_CHECK(a.seq_length > 0, "--seq-length is required (a positive integer)");
  MEGATRON_CHECK(a.micro_batch_size > 0, "--micro-batch-size must be positive, got ",
                 a.micro_batch_size);
  const int64_t dp = validate_parallel_layout(a, world_size, rank);
  validate_recompute(a, a.num_layers / a.pipeline_model_parallel_size);
  validate_fp8_args(a);
  validate_fsdp_args(a);
  validate_precision_aware_args(a);
  for (const std::string& note : validate_muon_args(a))
    if (rank == 0) log_line("WARNING: " + note);
  for (const std::string& note : validate_qk_clip_args(a))
    if (rank == 0) log_line("WARNING: " + note);
  if (!a.no_weight_decay_cond_type.empty()) {  // Megatron's rewrite, warning and choices
    MEGATRON_CHECK(a.no_weight_decay_cond_type == "apply_wd_to_qk_layernorm",
                   "--no-weight-decay-cond-type must be apply_wd_to_qk_layernorm, got '",
                   a.no_weight_decay_cond_type, "' (use --apply-wd-to-qk-layernorm)");
    if (rank == 0) {
      log_line(
          "WARNING: --no-weight-decay-cond-type is deprecated. Please use "
          "--apply-wd-to-qk-layernorm instead.");
    }
    a.apply_wd_to_qk_layernorm = true;
    a.no_weight_decay_cond_type.clear();
  }
  validate_rerun_args(a);
  // Megatron core 0.19's BlendedMegatronDatasetConfig assertions.
  MEGATRON_CHECK(!a.dataloader_fast_cache_load || !a.data_cache_path.empty(),
                 "--data-cache-path must be provided when using --dataloader-fast-cache-load.");
  MEGATRON_CHECK(!a.dataloader_fast_cache_load || a.data_path.empty(),
                 "--dataloader-fast-cache-load and --data-path cannot be used together. Use "
                 "--per-split-data-args-path or --train-data-path, --valid-data-path and "
                 "--test-data-path instead.");
  MEGATRON_CHECK(!a.dataloader_defer_npy_index_mmap || !a.data_cache_path.empty(),
                 "--data-cache-path must be provided when using "
                 "--dataloader-defer-npy-index-mmap.");
  // Megatron's DistributedDataParallelConfig assertion (grad_reduce_in_fp32 is the default).
  MEGATRON_CHECK(
      a.ddp_param_name_patterns_for_fp32_local_accumulation.empty() || a.grad_reduce_in_bf16,
      "Only need to explicitly specify param_name patterns for FP32 local accumulation "
      "if .main_grads aren't already in FP32: "
      "--ddp-param-name-patterns-for-fp32-local-accumulation needs "
      "--grad-reduce-in-bf16");
  if (a.num_distributed_optimizer_instances != 1) {
    // (Its divisibility and positivity: make_parallel_grid, in validate_parallel_layout.)
    MEGATRON_CHECK(!a.use_megatron_fsdp || a.data_parallel_sharding_strategy != "no_shard",
                   "--num-distributed-optimizer-instances with --use-megatron-fsdp shards within "
                   "each instance (hybrid sharding, HSDP): choose "
                   "--data-parallel-sharding-strategy optim, optim_grads or optim_grads_params");
    MEGATRON_CHECK(a.use_distributed_optimizer,
                   "Partial DistOpt cannot be used without DistOpt: "
                   "--num-distributed-optimizer-instances needs --use-distributed-optimizer");
    MEGATRON_CHECK(!a.ddp_reduce_scatter_with_fp32_accumulation || a.use_megatron_fsdp,
                   "RS w/ FP32 accumulation not supported with num_distributed_optimizer_instances "
                   "> 1: drop --ddp-reduce-scatter-with-fp32-accumulation or use one instance");
    if (a.num_experts > 0) {
      // Experts split apart shard over the expert-data-parallel ranks, cut the same way.
      const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size
                                                            : a.tensor_model_parallel_size;
      const int64_t edp =
          world_size / a.pipeline_model_parallel_size / (etp * a.expert_model_parallel_size);
      MEGATRON_CHECK(edp % a.num_distributed_optimizer_instances == 0,
                     "Expert data parallel size should be divisible by partial DistOpt shard "
                     "factor: the expert-data-parallel size (",
                     edp, ") must be divisible by --num-distributed-optimizer-instances (",
                     a.num_distributed_optimizer_instances, ")");
    }
  }
  if (a.global_batch_size == 0) a.global_batch_size = a.micro_batch_size * dp;
  MEGATRON_CHECK(a.global_batch_size > 0, "--global-batch-size must be positive, got ",
                 a.global_batch_size);
  validate_batch_schedule(a, dp);
  if (a.overlap_param_gather) {
    // Megatron r0.14's rule and message. Megatron-FSDP with no_shard has no weights to gather
    // (they are replicated): accepted, nothing to overlap.
    MEGATRON_CHECK(a.use_distributed_optimizer || a.use_megatron_fsdp,
                   "--overlap-param-gather only supported with distributed optimizer or megatron "
                   "fsdp: add --use-distributed-optimizer or --use-megatron-fsdp");
    MEGATRON_CHECK(a.overlap_grad_reduce,
                   "Must use --overlap-param-gather with --overlap-grad-reduce");
  }
  MEGATRON_CHECK(a.ddp_bucket_size >= 0,
                 "--ddp-bucket-size must be >= 0 elements (0: Megatron's default), got ",
                 a.ddp_bucket_size);
  if (a.ddp_num_buckets != -1) {  // Megatron's two assertions
    MEGATRON_CHECK(a.ddp_bucket_size == 0,
                   "Cannot specify both --ddp-num-buckets and --ddp-bucket-size");
    MEGATRON_CHECK(a.ddp_num_buckets > 0, "--ddp-num-buckets must be greater than 0, got ",
                   a.ddp_num_buckets);
  }
  MEGATRON_CHECK(a.optimizer == "adam" || a.optimizer == "sgd" || a.optimizer == "muon" ||
                     a.optimizer == "lion" || a.optimizer == "onebit_adam",
                 "--optimizer ", a.optimizer,
                 " is not supported (adam, sgd, muon, lion, onebit_adam)");
  // torch.optim.SGD's check (the precision-aware optimizer's "only adam" is checked with it).
  if (a.optimizer == "sgd")
    MEGATRON_CHECK(a.sgd_momentum >= 0, "--sgd-momentum must be >= 0, got ", a.sgd_momentum);
  if (a.optimizer == "onebit_adam") {
    MEGATRON_CHECK(!a.use_distributed_optimizer,
                   "--optimizer onebit_adam with --use-distributed-optimizer: 1-bit Adam averages "
                   "every rank's whole momentum, which the distributed optimizer shards over the "
                   "data-parallel ranks (DeepSpeed: 1-bit Adam is not compatible with ZeRO); "
                   "drop one of them");
    MEGATRON_CHECK(a.num_experts <= 0,
                   "--optimizer onebit_adam with --num-experts: expert gradients reduce over "
                   "their own expert-data-parallel group, which the compressed exchange does not "
                   "cover; use --optimizer adam");
    MEGATRON_CHECK(a.onebit_freeze_step >= 1, "--onebit-freeze-step must be at least 1, got ",
                   a.onebit_freeze_step);
    MEGATRON_CHECK(!a.calculate_per_token_loss,
                   "--optimizer onebit_adam with --calculate-per-token-loss: the compressed stage "
                   "averages the ranks' momenta, where per-token gradients must be summed; drop "
                   "--calculate-per-token-loss");
    MEGATRON_CHECK(a.device != "cuda",
                   "--optimizer onebit_adam runs on the CPU device: drop --device cuda");
  }
  // --lr 0 is allowed, as in Megatron: the weights stay as they are (the CLI requires the flag).
  MEGATRON_CHECK(a.lr >= 0, "--lr must be >= 0, got ", a.lr);
  MEGATRON_CHECK(a.min_lr >= 0 && a.min_lr <= a.lr, "--min-lr (", a.min_lr,
                 ") must be in [0, --lr = ", a.lr, "]");
  MEGATRON_CHECK(a.lr_warmup_init <= a.lr, "--lr-warmup-init (", a.lr_warmup_init,
                 ") must not exceed --lr (", a.lr, ")");
  validate_optimizer_schedules(a);
  MEGATRON_CHECK(!(a.lr_warmup_fraction >= 0 && a.lr_warmup_iters > 0),
                 "can only specify one of --lr-warmup-fraction and --lr-warmup-iters");
  MEGATRON_CHECK(a.lr_warmup_fraction < 0 || a.lr_warmup_fraction <= 1,
                 "--lr-warmup-fraction must be in [0, 1], got ", a.lr_warmup_fraction);
  if (a.train_samples == 0) {
    const int64_t decay = a.lr_decay_iters > 0 ? a.lr_decay_iters : a.train_iters;
    MEGATRON_CHECK(a.lr_warmup_iters <= decay, "--lr-warmup-iters (", a.lr_warmup_iters,
                   ") exceeds the decay length (", decay, " iterations)");
    if (a.lr_decay_style == "WSD") {
      MEGATRON_CHECK(a.lr_wsd_decay_iters > 0 && a.lr_wsd_decay_iters <= decay,
                     "--lr-decay-style WSD needs --lr-wsd-decay-iters in (0, ", decay, "]");
    }
  } else {
    const int64_t decay = a.lr_decay_samples > 0 ? a.lr_decay_samples : a.train_samples;
    MEGATRON_CHECK(a.lr_warmup_samples <= decay, "--lr-warmup-samples (", a.lr_warmup_samples,
                   ") exceeds the decay length (", decay, " samples)");
    if (a.lr_decay_style == "WSD") {
      MEGATRON_CHECK(a.lr_wsd_decay_samples > 0 && a.lr_wsd_decay_samples <= decay,
                     "--lr-decay-style WSD needs --lr-wsd-decay-samples in (0, ", decay, "]");
    }
  }
  MEGATRON_CHECK(a.log_interval > 0, "--log-interval must be positive, got ", a.log_interval);
  MEGATRON_CHECK(a.log_memory_interval >= 0 && a.log_memory_interval % a.log_interval == 0,
                 "--log-memory-interval must be a multiple of --log-interval (", a.log_interval,
                 "), got ", a.log_memory_interval);
  MEGATRON_CHECK(a.timing_log_level >= 0 && a.timing_log_level <= 2,
                 "--timing-log-level must be 0, 1 or 2, got ", a.timing_log_level);
  MEGATRON_CHECK(a.tensorboard_log_interval > 0, "--tensorboard-log-interval must be positive");
  MEGATRON_CHECK(a.clip_grad >= 0, "--clip-grad must be >= 0, got ", a.clip_grad);
  MEGATRON_CHECK(a.weight_decay >= 0, "--weight-decay must be >= 0, got ", a.weight_decay);
  MEGATRON_CHECK(a.adam_beta1 >= 0 && a.adam_beta1 < 1 && a.adam_beta2 >= 0 && a.adam_beta2 < 1,
                 "--adam-beta1 and --adam-beta2 must be in [0, 1)");
  MEGATRON_CHECK(a.num_threads >= 0, "--num-threads must be >= 0, got ", a.num_threads);
  MEGATRON_CHECK(a.device == "auto" || a.device == "cpu" || a.device == "cuda",
                 "--device must be cpu, cuda or auto, got '", a.device, "'");
}

namespace {
template <typename T>
std::string text(const T& v) {
  std::ostringstream os;
  os << std::boolalpha << v;
  return os.str();
}
}  // namespace

void resolve_vocab_size(Arguments& a, const ArgTable& t) {
  if (a.tokenizer_type == "NullTokenizer") {  // its vocabulary is --vocab-size
    build_tokenizer(tokenizer_args(a));       // its --null-tokenizer-* ids checked now
    return;
  }
  const auto tokenizer = build_tokenizer(tokenizer_args(a));
  const int64_t tok_vocab = tokenizer->vocab_size();
  // The FIM tokens looked up now, on every rank, rather than when the data is built.
  if (const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(tokenizer.get()); hf && a.fim_data)
    fim_tokens(data_config(a).fim, *hf);
  const bool hf_pretrained =
      !a.pretrained_checkpoint.empty() &&
      !std::filesystem::exists(std::filesystem::path(a.pretrained_checkpoint) /
                               checkpoint::kTrackerFile);
  if (hf_pretrained) {
    MEGATRON_CHECK(tok_vocab <= a.vocab_size, "the tokenizer has ", tok_vocab, " tokens but ",
                   a.pretrained_checkpoint, "/config.json has vocab_size ", a.vocab_size,
                   "; use the checkpoint's tokenizer");
    return;
  }
  MEGATRON_CHECK(!t.given("--vocab-size") || a.vocab_size == tok_vocab, "--vocab-size ",
                 a.vocab_size, " contradicts the ", a.tokenizer_type, " vocabulary (", tok_vocab,
                 " tokens); drop --vocab-size");
  a.vocab_size = tok_vocab;
}

void merge_pretrained_config(Arguments& a, const ArgTable& t) {
  if (a.pretrained_checkpoint.empty()) return;
  if (std::filesystem::exists(std::filesystem::path(a.pretrained_checkpoint) /
                              checkpoint::kTrackerFile)) {
    // One of our checkpoints: its model arguments, except the architecture this run trains
    // (a classifier from a pretrained BERT) and the sequence length.
    namespace cp = checkpoint;
    const std::optional<int64_t> it = cp::read_tracker(a.pretrained_checkpoint);
    MEGATRON_CHECK(it.has_value(), "--pretrained-checkpoint ", a.pretrained_checkpoint,
                   ": unreadable ", cp::kTrackerFile);
    const std::string dir = cp::iteration_dir(a.pretrained_checkpoint, *it);
    const cp::CheckpointReader reader = cp::CheckpointReader::open(dir);
    nlohmann::json saved = reader.metadata().value("arguments", nlohmann::json::object());
    if (saved.empty())
      saved = model_record_as_flags(reader.metadata().value("args", nlohmann::json::object()));
    if (saved.value("model", std::string()) != "llava") {
      // A language model's checkpoint as a LLaVA's language model (Megatron's combine step):
      // the vision settings are this run's.
      for (const char* key :
           {"vision_model_type", "vision_hidden_size", "vision_num_attention_heads",
            "vision_ffn_hidden_size", "img_h", "img_w", "patch_dim", "disable_vision_class_token",
            "vision_projection_type", "vision_projection_ffn_hidden_size", "dataloader_seq_length",
            "encoder_num_layers"})
        saved.erase(key);
    }
    saved.erase("model");
    if (!tokenizer_reads_vocab_size(a.tokenizer_type)) saved.erase("vocab_size");
    t.restore("model", saved,
              {"--model", "--seq-length", "--encoder-seq-length", "--decoder-seq-length"}, dir);
    return;
  }
  const TransformerConfig c = model_spec(a.model).hf.read_config(a.pretrained_checkpoint);
  const std::string src = a.pretrained_checkpoint + "/config.json";
  auto set = [&](const std::string& flag, auto& field, auto value) {
    if (t.given(flag) && field != value) {
      MEGATRON_CHECK(false, flag, " ", text(field), " contradicts ", src, " (which implies ",
                     text(value), "); drop the flag to take the checkpoint's value");
    }
    field = value;
  };
  set("--num-layers", a.num_layers, c.num_layers);
  set("--hidden-size", a.hidden_size, c.hidden_size);
  set("--ffn-hidden-size", a.ffn_hidden_size, c.ffn_hidden_size);
  set("--num-attention-heads", a.num_attention_heads, c.num_attention_heads);
  const bool gqa = c.num_query_groups != 0 && c.num_query_groups != c.num_attention_heads;
  if (gqa || t.given("--group-query-attention")) {
    set("--num-query-groups", a.num_query_groups,
        c.num_query_groups ? c.num_query_groups : c.num_attention_heads);
    a.group_query_attention = true;
  }
  // HF's head dimension is head_dim when given, else hidden / heads.
  const int64_t head_dim =
      c.kv_channels ? c.kv_channels
                    : (c.num_attention_heads ? c.hidden_size / c.num_attention_heads : 0);
  set("--kv-channels", a.kv_channels, head_dim);
  set("--max-position-embeddings", a.max_position_embeddings, c.max_position_embeddings);
  set("--position-embedding-type", a.position_embedding_type,
      std::string(c.position_embedding == PositionEmbedding::kRope       ? "rope"
                  : c.position_embedding == PositionEmbedding::kYarn     ? "yarn"
                  : c.position_embedding == PositionEmbedding::kRelative ? "relative"
                  : c.position_embedding == PositionEmbedding::kNone     ? "none"
                                                                         : "learned_absolute"));
  if (c.heterogeneous.enabled()) {  // Llama-Nemotron: Megatron's heterogeneous flags
    set("--heterogeneous-layers-config-encoded-json", a.heterogeneous_layers_config_encoded_json,
        c.heterogeneous.json);
    set("--num-query-groups", a.num_query_groups, c.num_query_groups);
    a.group_query_attention = true;
    a.use_rotary_position_embeddings = true;  // Megatron's check asks for the legacy flag too
  }
  // Multi-token prediction: one depth per block of the files, or with a repeated layer (the
  // file's mtp_use_repeated_layer or the flag) as many applications of its one block as a given
  // --mtp-num-layers asks.
  MEGATRON_CHECK(!a.mtp_use_repeated_layer || c.mtp_num_layers <= 1,
                 "--mtp-use-repeated-layer: ", src, " describes ", c.mtp_num_layers,
                 " multi-token prediction blocks; a repeated layer is one block (drop the flag)");
  const bool repeated =
      c.mtp_num_layers == 1 && (c.mtp_use_repeated_layer || a.mtp_use_repeated_layer);
  // A given --mtp-num-layers 0 drops a NemotronH's MTP blocks (their tensors are skipped).
  const bool drop = c.mamba.enabled() && t.given("--mtp-num-layers") && a.mtp_num_layers == 0;
  // A repeated block's depths: --mtp-num-layers, else a given hybrid pattern's '/' parts.
  int64_t asked = t.given("--mtp-num-layers") ? a.mtp_num_layers : 0;
  if (asked == 0 && c.mamba.enabled()) {
    for (const char* flag : {"--hybrid-layer-pattern", "--hybrid-override-pattern"})
      if (t.given(flag))
        asked = parse_hybrid_pattern(flag == std::string("--hybrid-layer-pattern")
                                         ? a.hybrid_layer_pattern
                                         : a.hybrid_override_pattern,
                                     flag)
                    .mtp_depths;
  }
  const int64_t depths = drop ? 0 : repeated && asked > 0 ? asked : c.mtp_num_layers;
  if (repeated && !drop) a.mtp_use_repeated_layer = true;
  if (c.mamba.enabled()) {  // NemotronH
    const MambaConfig& mb = c.mamba;
    // The unified pattern, with the MTP depths after '/'. A given --hybrid-layer-pattern with
    // the same layers stays (its '|' segments are this run's pipeline layout).
    std::string pattern = mb.layers;
    for (int64_t k = 0; k < depths; ++k) pattern += "/" + mb.mtp_layers;
    const bool layer_flag = t.given("--hybrid-layer-pattern");
    if (layer_flag || t.given("--hybrid-override-pattern")) {
      const std::string& text = layer_flag ? a.hybrid_layer_pattern : a.hybrid_override_pattern;
      const char* flag = layer_flag ? "--hybrid-layer-pattern" : "--hybrid-override-pattern";
      const HybridPattern given = parse_hybrid_pattern(text, flag);
      MEGATRON_CHECK(given.main == mb.layers && given.mtp_depths == depths &&
                         (depths == 0 || given.mtp == mb.mtp_layers),
                     flag, " ", text, " contradicts ", src, " (which implies ", pattern,
                     " up to '|'); drop the flag to take the checkpoint's layers");
    } else {
      a.hybrid_override_pattern = pattern;
    }
    set("--mamba-state-dim", a.mamba_state_dim, mb.state_dim);
    set("--mamba-head-dim", a.mamba_head_dim, mb.head_dim);
    set("--mamba-num-groups", a.mamba_num_groups, mb.num_groups);
    set("--mamba-num-heads", a.mamba_num_heads, mb.num_heads);
  }
  if (c.position_embedding == PositionEmbedding::kRelative) {
    set("--relative-attention-num-buckets", a.relative_attention_num_buckets,
        c.relative_attention_num_buckets);
    set("--relative-attention-max-distance", a.relative_attention_max_distance,
        c.relative_attention_max_distance);
  }
  if (c.decoder_num_layers > 0)
    set("--decoder-num-layers", a.decoder_num_layers, c.decoder_num_layers);
  set("--softmax-scale", a.softmax_scale, c.softmax_scale);
  set("--gated-linear-unit", a.gated_linear_unit, c.gated_gelu);
  if (c.mtp_num_layers > 0 && !drop) set("--mtp-num-layers", a.mtp_num_layers, depths);
  if (c.mla.enabled) {  // DeepSeek-V3
    const MlaConfig& m = c.mla;
    set("--multi-latent-attention", a.multi_latent_attention, true);
    if (m.q_lora_rank > 0) set("--q-lora-rank", a.q_lora_rank, m.q_lora_rank);
    set("--kv-lora-rank", a.kv_lora_rank, m.kv_lora_rank);
    set("--qk-head-dim", a.qk_head_dim, m.qk_head_dim);
    set("--qk-pos-emb-head-dim", a.qk_pos_emb_head_dim, m.qk_pos_emb_head_dim);
    set("--v-head-dim", a.v_head_dim, m.v_head_dim);
    set("--rope-type", a.rope_type, std::string(m.yarn ? "yarn" : "rope"));
    if (m.yarn) {
      set("--rotary-scaling-factor", a.rotary_scaling_factor, m.rotary_scaling_factor);
      set("--mscale", a.mscale, m.mscale);
      set("--mscale-all-dim", a.mscale_all_dim, m.mscale_all_dim);
    }
  }
  if (c.position_embedding == PositionEmbedding::kYarn) {  // gpt-oss
    set("--rotary-scaling-factor", a.rotary_scaling_factor, c.yarn_factor);
    set("--yarn-original-max-position-embeddings", a.yarn_original_max_position_embeddings,
        c.yarn_original_max_positions);
    set("--yarn-beta-fast", a.yarn_beta_fast, c.yarn_beta_fast);
    set("--yarn-beta-slow", a.yarn_beta_slow, c.yarn_beta_slow);
    set("--yarn-correction-range-round-to-int", a.yarn_correction_range_round_to_int,
        c.yarn_round_to_int);
    set("--mscale", a.mscale, c.yarn_mscale);
    set("--mscale-all-dim", a.mscale_all_dim, c.yarn_mscale_all_dim);
  }
  if (c.position_embedding == PositionEmbedding::kRope ||
      c.position_embedding == PositionEmbedding::kYarn) {
    set("--rotary-base", a.rotary_base, c.rotary_base);
    set("--rotary-percent", a.rotary_percent, 1.0);  // HF Llama rotates the whole head
    set("--rotary-interleaved", a.rotary_interleaved, false);
    set("--use-rope-scaling", a.use_rope_scaling, c.rope_scaling_factor > 0);
    if (c.rope_scaling_factor > 0)
      set("--rope-scaling-factor", a.rope_scaling_factor, c.rope_scaling_factor);
    if (c.rotary_seq_len_interpolation_factor > 0) {
      set("--rotary-seq-len-interpolation-factor", a.rotary_seq_len_interpolation_factor,
          c.rotary_seq_len_interpolation_factor);
    }
  }
  set("--normalization", a.normalization,
      std::string(c.normalization == Normalization::kRMSNorm ? "RMSNorm" : "LayerNorm"));
  set("--norm-epsilon", a.norm_epsilon, c.norm_epsilon);
  set("--swiglu", a.swiglu, c.swiglu);
  set("--openai-gelu", a.openai_gelu, c.openai_gelu);
  set("--squared-relu", a.squared_relu, c.squared_relu);
  set("--qk-layernorm", a.qk_layernorm, c.qk_layernorm);
  set("--disable-bias-linear", a.disable_bias_linear, !c.add_bias_linear);
  set("--add-qkv-bias", a.add_qkv_bias, c.add_qkv_bias);
  // gpt-oss's attention and MLP.
  set("--quick-geglu", a.quick_geglu, c.quick_geglu);
  if (c.quick_geglu) {
    set("--glu-linear-offset", a.glu_linear_offset, c.glu_linear_offset);
    if (c.activation_clamp > 0)
      set("--activation-func-clamp-value", a.activation_func_clamp_value, c.activation_clamp);
  }
  set("--softmax-type", a.softmax_type,
      std::string(c.softmax_type == SoftmaxType::kLearnable  ? "learnable"
                  : c.softmax_type == SoftmaxType::kOffByOne ? "off-by-one"
                                                             : "vanilla"));
  if (c.window_attention) {
    set("--window-size", a.window_size, std::to_string(c.window_left) + ",0");
    std::string layers = "[";
    for (size_t i = 0; i < c.window_layers.size(); ++i)
      layers += (i ? "," : "") + std::to_string(c.window_layers[i]);
    if (!c.window_layers.empty())
      set("--window-attn-skip-freq", a.window_attn_skip_freq, layers + "]");
  }
  set("--untie-embeddings-and-output-weights", a.untie_embeddings_and_output_weights,
      c.untie_embeddings_and_output_weights);
  set("--vocab-size", a.vocab_size, c.vocab_size);
  if (c.moe.enabled()) {
    set("--num-experts", a.num_experts, c.moe.num_experts);
    set("--moe-router-topk", a.moe_router_topk, c.moe.router_topk);
    set("--moe-ffn-hidden-size", a.moe_ffn_hidden_size, c.moe.ffn_hidden_size);
    set("--moe-router-pre-softmax", a.moe_router_pre_softmax, c.moe.pre_softmax);
    if (c.moe.score_function == MoeScoreFunction::kSigmoid)  // DeepSeek-V3's router
      set("--moe-router-score-function", a.moe_router_score_function, std::string("sigmoid"));
    set("--moe-router-enable-expert-bias", a.moe_router_enable_expert_bias,
        c.moe.enable_expert_bias);
    // None for a file without groups: a given group count above 1 contradicts it (one group
    // routes as none).
    if (c.moe.num_groups > 0 || a.moe_router_num_groups > 1) {
      set("--moe-router-num-groups", a.moe_router_num_groups, c.moe.num_groups);
      set("--moe-router-group-topk", a.moe_router_group_topk, c.moe.group_topk);
    }
    if (c.moe.topk_scaling_factor > 0) {
      set("--moe-router-topk-scaling-factor", a.moe_router_topk_scaling_factor,
          c.moe.topk_scaling_factor);
    }
    if (c.moe.shared_expert_intermediate_size > 0) {
      set("--moe-shared-expert-intermediate-size", a.moe_shared_expert_intermediate_size,
          c.moe.shared_expert_intermediate_size);
      set("--moe-shared-expert-gate", a.moe_shared_expert_gate, c.moe.shared_expert_gate);
    }
    // The experts' width is the file's (LatentMoE's, or the hidden size: 0).
    set("--moe-latent-size", a.moe_latent_size, c.moe.latent_size);
    std::string freq = "1";
    if (!c.moe.layer_pattern.empty()) {
      freq = "[";
      for (size_t i = 0; i < c.moe.layer_pattern.size(); ++i)
        freq += (i ? "," : "") + std::to_string(c.moe.layer_pattern[i]);
      freq += "]";
    }
    // A hybrid model's MoE layers are its pattern's E layers (restored above), not a frequency.
    if (!c.mamba.enabled()) set("--moe-layer-freq", a.moe_layer_freq, freq);
  }
  set("--transformer-block-type", a.transformer_block_type,
      std::string(c.post_layernorm ? "post_ln" : "pre_ln"));
  if (c.vision.enabled()) {  // a LlavaForConditionalGeneration directory
    const VisionConfig& v = c.vision;
    set("--vision-model-type", a.vision_model_type, v.model_type);
    set("--encoder-num-layers", a.vision_num_layers, v.num_layers);
    set("--vision-hidden-size", a.vision_hidden_size, v.hidden_size);
    set("--vision-num-attention-heads", a.vision_num_attention_heads, v.num_attention_heads);
    set("--vision-ffn-hidden-size", a.vision_ffn_hidden_size, v.ffn_hidden_size);
    set("--img-h", a.img_h, v.img_h);
    set("--img-w", a.img_w, v.img_w);
    set("--patch-dim", a.patch_dim, v.patch_dim);
    set("--disable-vision-class-token", a.disable_vision_class_token, !v.class_token);
    set("--vision-projection-type", a.vision_projection_type, v.projection_type);
    set("--vision-projection-ffn-hidden-size", a.vision_projection_ffn_hidden_size,
        v.projection_ffn_hidden_size);
    return;  // the language model's length comes from --dataloader-seq-length and the images
  }
  if (!t.given("--seq-length")) a.seq_length = c.max_position_embeddings;
}

namespace {

// Megatron's pretrain_vlm.py: the vision encoder has --encoder-num-layers layers (--num-layers
// sets both), the language model --decoder-num-layers (default --num-layers); the language
// model's sequence is --dataloader-seq-length text tokens plus one image's embeddings (the image
// token's own place given back), padded to a multiple of the TP size under sequence parallelism.
void resolve_llava(Arguments& a, const ArgTable& t) {
  // From a pretrained LLaVA directory, or the flags.
  const int64_t vision = a.vision_num_layers > 0           ? a.vision_num_layers
                         : t.given("--encoder-num-layers") ? a.encoder_num_layers
                                                           : a.num_layers;
  const int64_t lm = a.decoder_num_layers > 0 ? a.decoder_num_layers : a.num_layers;
  MEGATRON_CHECK(vision > 0,
                 "--model llava needs the vision encoder's layers: --encoder-num-layers (or "
                 "--num-layers, which sets the encoder's and the decoder's)");
  MEGATRON_CHECK(lm > 0,
                 "--model llava needs the language model's layers: --decoder-num-layers (or "
                 "--num-layers)");
  MEGATRON_CHECK(!t.given("--decoder-seq-length") && !t.given("--encoder-seq-length"),
                 "--encoder-seq-length and --decoder-seq-length are derived for --model llava "
                 "(the image size and --dataloader-seq-length fix them): drop them");
  MEGATRON_CHECK(a.patch_dim > 0 && a.img_h > 0 && a.img_w > 0,
                 "--patch-dim, --img-h and --img-w must be positive");
  MEGATRON_CHECK(a.img_h % a.patch_dim == 0 && a.img_w % a.patch_dim == 0, "--img-h (", a.img_h,
                 ") and --img-w (", a.img_w, ") must be multiples of --patch-dim (", a.patch_dim,
                 ")");
  a.vision_num_layers = a.encoder_num_layers = vision;
  a.num_layers = lm;
  if (a.dataloader_seq_length == 0) a.dataloader_seq_length = a.seq_length;
  MEGATRON_CHECK(a.dataloader_seq_length > 0,
                 "--model llava needs the text length: --dataloader-seq-length (or --seq-length)");
  int64_t seq = a.dataloader_seq_length + vision_config_from_args(a).num_image_embeddings();
  const int64_t tp = a.tensor_model_parallel_size;
  if (a.sequence_parallel && tp > 1) seq = (seq + tp - 1) / tp * tp;
  a.seq_length = a.encoder_seq_length = seq;
  a.max_position_embeddings = std::max(a.max_position_embeddings, seq);
}

}  // namespace

void resolve_encoder_decoder(Arguments& a, const ArgTable& t, bool training) {
  for (const char* flag :
       {"--vision-model-type", "--vision-hidden-size", "--vision-num-attention-heads",
        "--vision-ffn-hidden-size", "--img-h", "--img-w", "--patch-dim",
        "--disable-vision-class-token", "--vision-projection-type",
        "--vision-projection-ffn-hidden-size", "--dataloader-seq-length", "--freeze-LM",
        "--freeze-ViT", "--pretrained-vision-checkpoint"}) {
    MEGATRON_CHECK(a.model == "llava" || !t.given(flag), flag,
                   " belongs to vision-language models (--model llava, `megatron pretrain_vlm`)");
  }
  if (a.model == "llava") {
    resolve_llava(a, t);
    return;
  }
  if (t.given("--encoder-num-layers")) {
    MEGATRON_CHECK(!t.given("--num-layers") || a.num_layers == a.encoder_num_layers,
                   "--num-layers (", a.num_layers, ") and --encoder-num-layers (",
                   a.encoder_num_layers, ") name the same thing: give one");
    a.num_layers = a.encoder_num_layers;
  }
  a.encoder_num_layers = a.num_layers;
  if (t.given("--encoder-seq-length")) {
    MEGATRON_CHECK(!t.given("--seq-length") || a.seq_length == a.encoder_seq_length,
                   "--seq-length (", a.seq_length, ") and --encoder-seq-length (",
                   a.encoder_seq_length, ") name the same thing: give one");
    a.seq_length = a.encoder_seq_length;
  }
  a.encoder_seq_length = a.seq_length;
  const bool t5 = a.model == "t5";
  MEGATRON_CHECK(t5 || (a.decoder_num_layers == 0 && a.decoder_seq_length == 0),
                 "--decoder-num-layers and --decoder-seq-length belong to encoder-decoder models "
                 "(--model t5, `megatron pretrain_t5`)");
  MEGATRON_CHECK(a.decoder_num_layers >= 0 && a.decoder_seq_length >= 0,
                 "--decoder-num-layers and --decoder-seq-length must be positive");
  if (!t5) return;
  if (a.decoder_num_layers == 0) a.decoder_num_layers = a.num_layers;
  MEGATRON_CHECK(!training || a.decoder_seq_length > 0,
                 "T5 needs --decoder-seq-length (the decoder's length: span targets + sentinels)");
  MEGATRON_CHECK(!training || a.vocab_extra_ids > 0,
                 "T5's span corruption replaces each span by a sentinel token <extra_id_i>: pass "
                 "--vocab-extra-ids N (Megatron's T5 examples use 100)");
  MEGATRON_CHECK(a.pipeline_model_parallel_size == 1, "--pipeline-model-parallel-size ",
                 a.pipeline_model_parallel_size,
                 ": pipeline parallelism is not supported for T5 (Megatron r0.14 removed it, "
                 "with --encoder-pipeline-model-parallel-size); use tensor, sequence and data "
                 "parallelism");
  MEGATRON_CHECK(a.context_parallel_size == 1,
                 "--context-parallel-size: T5's bidirectional encoder and cross-attention have no "
                 "context-parallel form here; use 1");
  MEGATRON_CHECK(a.num_experts == 0,
                 "--num-experts: T5 with Mixture-of-Experts layers is not "
                 "supported; drop --num-experts");
  MEGATRON_CHECK(!a.reset_attention_mask && !a.reset_position_ids,
                 "--reset-attention-mask / --reset-position-ids apply to GPT documents, not to "
                 "T5's span-corruption samples");
  MEGATRON_CHECK(!a.sequence_parallel || a.decoder_seq_length % a.tensor_model_parallel_size == 0,
                 "--decoder-seq-length (", a.decoder_seq_length,
                 ") must be divisible by --tensor-model-parallel-size (",
                 a.tensor_model_parallel_size, ") with --sequence-parallel");
}

void resolve_finetuning(Arguments& a, const ArgTable& t) {
  const bool finetune = a.model == "bert_classification";
  const bool given = t.given("--task") || t.given("--train-data") || t.given("--valid-data") ||
                     t.given("--epochs");
  MEGATRON_CHECK(finetune || !given,
                 "--task, --train-data, --valid-data and --epochs belong to "
                 "`megatron finetune` (--model bert_classification)");
  if (!finetune) return;
  // Its evaluation reads every example once, padded to whole --global-batch-size batches.
  MEGATRON_CHECK(!t.given("--eval-micro-batch-size") && !t.given("--eval-global-batch-size"),
                 "megatron finetune evaluates in the training batch sizes (every validation "
                 "example once): drop --eval-micro-batch-size and --eval-global-batch-size");
  MEGATRON_CHECK(!a.task.empty(), "megatron finetune needs --task (classification, MNLI, QQP)");
  MEGATRON_CHECK(!a.train_data.empty(), "megatron finetune needs --train-data");
  const ClassificationTask task = classification_task(a.task);
  const auto train = read_classification_examples(task, a.train_data, "--train-data");
  a.num_classes = static_cast<int64_t>(classification_labels(task, train).size());
  const auto n = static_cast<int64_t>(train.size());
  MEGATRON_CHECK(a.global_batch_size > 0, "--global-batch-size must be set for finetuning");
  // Megatron: train_iters = epochs x iterations per epoch (whole global batches).
  const int64_t per_epoch = std::max<int64_t>(1, n / a.global_batch_size);
  if (t.given("--epochs")) {
    MEGATRON_CHECK(a.epochs > 0, "--epochs must be positive, got ", a.epochs);
    MEGATRON_CHECK(!t.given("--train-iters"), "--epochs sets --train-iters; pass one of them");
    a.train_iters = a.epochs * per_epoch;
  }
  MEGATRON_CHECK(a.train_iters > 0, "megatron finetune needs --epochs (or --train-iters)");
  if (!a.valid_data.empty()) {
    const auto valid = read_classification_examples(task, a.valid_data, "--valid-data");
    const auto m = static_cast<int64_t>(valid.size());
    // One evaluation sees every validation example once (the data is padded to whole batches).
    if (!t.given("--eval-iters"))
      a.eval_iters = (m + a.global_batch_size - 1) / a.global_batch_size;
    if (!t.given("--eval-interval")) a.eval_interval = per_epoch;
  } else if (!t.given("--eval-iters")) {
    a.eval_iters = 0;
  }
}

namespace {
std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
}  // namespace

namespace {

// The JSON object of file `path` that `flag` names (exit 2 naming both when unreadable, not
// JSON, or not an object; `what` says what the object must hold).
nlohmann::json read_json_object(const std::string& flag, const std::string& path,
                                const std::string& what) {
  std::ifstream f(path);
  MEGATRON_CHECK(f.good(), flag, ": cannot read '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, flag, ": '", path, "' is not JSON (", e.what(), ")");
  }
  MEGATRON_CHECK(j.is_object(), flag, ": '", path, "' must hold ", what);
  return j;
}

// --per-dataset-sequences-path: {prefix: [sequence count, document count]} as Megatron's
// tools/build_sequences_per_dataset.py writes it (the .idx header's two counts).
void read_sequences_per_dataset(Arguments& a) {
  const std::string& path = a.per_dataset_sequences_path;
  const nlohmann::json j = read_json_object("--per-dataset-sequences-path", path,
                                            "an object {prefix: [sequences, documents]}");
  for (const auto& [prefix, v] : j.items()) {
    MEGATRON_CHECK(
        v.is_array() && v.size() == 2 && v[0].is_number_unsigned() && v[1].is_number_unsigned(),
        "--per-dataset-sequences-path: '", path, "': the entry of '", prefix,
        "' must be [sequences, documents], two non-negative integers; got ", v.dump());
    a.sequences_per_dataset[prefix] = {v[0].get<int64_t>(), v[1].get<int64_t>()};
  }
}

}  // namespace

void read_data_args_files(Arguments& a) {
  // Megatron's get_blend_and_blend_per_split: the file replaces the flag it stands for.
  if (!a.data_args_path.empty()) {
    MEGATRON_CHECK(a.data_path.empty(),
                   "--data-args-path and --data-path both give the data; "
                   "pass one");
    std::ifstream f(a.data_args_path);
    MEGATRON_CHECK(f.good(), "--data-args-path: cannot read '", a.data_args_path, "'");
    std::stringstream text;
    text << f.rdbuf();
    a.data_path = words(text.str());
    MEGATRON_CHECK(!a.data_path.empty(), "--data-args-path: '", a.data_args_path,
                   "' holds no dataset prefix");
  }
  if (!a.per_dataset_sequences_path.empty()) read_sequences_per_dataset(a);
  if (a.per_split_data_args_path.empty()) return;
  MEGATRON_CHECK(a.train_data_path.empty() && a.valid_data_path.empty() && a.test_data_path.empty(),
                 "--per-split-data-args-path and --train/valid/test-data-path both give the "
                 "splits; pass one");
  const std::string& path = a.per_split_data_args_path;
  const nlohmann::json j = read_json_object("--per-split-data-args-path", path,
                                            "an object with the keys train, valid and test");
  const std::pair<const char*, std::vector<std::string>*> splits[] = {
      {"train", &a.train_data_path}, {"valid", &a.valid_data_path}, {"test", &a.test_data_path}};
  for (const auto& [key, field] : splits) {
    MEGATRON_CHECK(j.contains(key), "--per-split-data-args-path: '", path, "' has no \"", key,
                   "\" entry");
    const nlohmann::json& v = j.at(key);
    if (v.is_string()) {
      *field = words(v.get<std::string>());
    } else {
      MEGATRON_CHECK(v.is_array(), "--per-split-data-args-path: '", path, "': \"", key,
                     "\" must be a list or a string of prefixes and weights");
      for (const nlohmann::json& w : v) {
        MEGATRON_CHECK(w.is_string() || w.is_number(), "--per-split-data-args-path: '", path,
                       "': \"", key, "\" holds ", w.dump(), ", not a prefix or a weight");
        field->push_back(w.is_string() ? w.get<std::string>() : w.dump());
      }
    }
  }
}

void merge_checkpoint_args(Arguments& a, const ArgTable& t, bool report) {
  namespace cp = checkpoint;
  MEGATRON_CHECK(!a.use_mp_args_from_checkpoint_args || a.use_checkpoint_args,
                 "--use-mp-args-from-checkpoint-args reads the checkpoint's arguments, which "
                 "--use-checkpoint-args loads: add --use-checkpoint-args");
  if (!a.use_checkpoint_args) return;
  // The checkpoint the load will read (a newer non-persistent one included).
  std::vector<std::string> notes;
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(a, &notes);
  MEGATRON_CHECK(choice.has_value(), "--use-checkpoint-args: --load ", a.load,
                 " has no checkpoint (no ", cp::kTrackerFile, ")");
  const std::string dir = cp::iteration_dir(choice->root, choice->iteration);
  const cp::CheckpointReader reader = cp::CheckpointReader::open(dir);
  const std::string src = dir + "/" + cp::kMetadataFile;
  // The argument table's record of the run that saved it ("arguments"); a checkpoint from before
  // that record, or from `megatron convert`, has only the resolved model arguments ("args"),
  // whose keys are the same dests but for two (model_record_as_flags).
  nlohmann::json saved = reader.metadata().value("arguments", nlohmann::json::object());
  if (saved.empty())
    saved = model_record_as_flags(reader.metadata().value("args", nlohmann::json::object()));
  // Every flag of the model concern; a given --seq-length wins (a run may train on other
  // lengths); the vocabulary of a NullTokenizer run is --vocab-size itself, else the tokenizer's.
  if (!t.given("--tokenizer-type") && saved.contains("tokenizer_type") &&
      saved["tokenizer_type"].is_string()) {
    a.tokenizer_type = saved["tokenizer_type"].get<std::string>();
  }
  if (!tokenizer_reads_vocab_size(a.tokenizer_type)) saved.erase("vocab_size");
  // Megatron also takes --tokenizer-model (not with --no-use-tokenizer-model-from-checkpoint-
  // args) and --tiktoken-pattern; here given flags win, as for the type, and only for the
  // saving run's type. TikTokenizer's special-token settings and NullTokenizer's EOD and pad ids
  // come along (an extension: Megatron leaves them to the command line).
  if (saved.value("tokenizer_type", nlohmann::json()) == nlohmann::json(a.tokenizer_type)) {
    nlohmann::json files = nlohmann::json::object();
    for (const char* key :
         {"tokenizer_model", "tiktoken_pattern", "tiktoken_num_special_tokens",
          "tiktoken_special_tokens", "null_tokenizer_eod_id", "null_tokenizer_pad_id"}) {
      if (!a.use_tokenizer_model_from_checkpoint_args && std::string(key) == "tokenizer_model")
        continue;
      if (saved.contains(key) && !saved[key].is_null()) files[key] = saved[key];
    }
    t.restore("tokenizer", files,
              {"--tokenizer-model", "--tiktoken-pattern", "--tiktoken-num-special-tokens",
               "--tiktoken-special-tokens", "--null-tokenizer-eod-id", "--null-tokenizer-pad-id"},
              src);
  }
  // A given sequence length wins (a run may train on other lengths), the encoder's and the
  // decoder's too.
  // A given --hybrid-layer-pattern wins too: its '|' segments are this run's pipeline layout
  // (the load refuses one with other layers, comparing the checkpoint's layer types).
  for (const std::string& line :
       t.restore("model", saved,
                 {"--seq-length", "--encoder-seq-length", "--decoder-seq-length",
                  "--hybrid-layer-pattern", "--hybrid-override-pattern"},
                 src)) {
    if (report) log_line(" > --use-checkpoint-args: " + line);
  }
  // Either spelling given wins (the other is the record's).
  if (t.given("--hybrid-layer-pattern")) a.hybrid_override_pattern.clear();
  if (t.given("--hybrid-override-pattern")) a.hybrid_layer_pattern.clear();
  // --use-mp-args-from-checkpoint-args: the saving run's model-parallel sizes as well, given
  // flags replaced (Megatron's force=True); the checkpoint loads into any layout either way.
  if (a.use_mp_args_from_checkpoint_args) {
    nlohmann::json mp = nlohmann::json::object();
    for (const char* key : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                            "num_layers_per_virtual_pipeline_stage",
                            "num_virtual_stages_per_pipeline_rank", "expert_model_parallel_size"}) {
      if (saved.contains(key)) mp[key] = saved[key];
    }
    for (const std::string& line : t.restore("parallel", mp, {}, src)) {
      if (report) log_line(" > --use-mp-args-from-checkpoint-args: " + line);
    }
  }
}

}  // namespace megatron::cli
