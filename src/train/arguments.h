// Arguments: every training flag, under Megatron's names (flag --foo-bar is field foo_bar), with
// Megatron's defaults. A plain struct: src/cli/ parses argv into it (one table drives parsing,
// --help, validation messages and the startup dump); the library only reads it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/layer_split.h"

namespace megatron {

// A float flag Megatron leaves at None until given (printed "None" in the argument dump).
inline constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();
inline bool is_set(double v) {
  return v == v;
}

struct Arguments {
  // ---- model ----
  std::string model = "gpt";  // architecture (models/model_spec.h); pretrain_gpt selects gpt
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // 0: 4 * hidden (Megatron's default)
  int64_t num_attention_heads = 0;
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  int64_t kv_channels = 0;  // 0: hidden / heads
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;  // 0: seq_length
  // Encoder-decoder models (T5). --encoder-num-layers and --encoder-seq-length are Megatron's
  // other names of --num-layers and --seq-length; the decoder's default to the encoder's layers.
  int64_t encoder_num_layers = 0, decoder_num_layers = 0;
  int64_t encoder_seq_length = 0, decoder_seq_length = 0;
  // Vision-language models (--model llava, Megatron's pretrain_vlm.py and examples/multimodal).
  std::string vision_model_type = "clip";  // --vision-model-type
  int64_t vision_num_layers = 0;           // resolved from --encoder-num-layers / --num-layers
  int64_t vision_hidden_size = 0, vision_num_attention_heads = 0, vision_ffn_hidden_size = 0;
  int64_t img_h = 224, img_w = 224, patch_dim = 16;  // --img-h, --img-w, --patch-dim
  bool disable_vision_class_token = false;
  std::string vision_projection_type = "mlp";
  int64_t vision_projection_ffn_hidden_size = 0;
  int64_t dataloader_seq_length = 0;            // text tokens per sample (0: --seq-length as given)
  bool freeze_lm = false, freeze_vit = false;   // --freeze-LM, --freeze-ViT
  int64_t relative_attention_num_buckets = 32;  // --position-embedding-type relative
  int64_t relative_attention_max_distance = 128;
  double softmax_scale = 0;  // 0: 1/sqrt(kv_channels); Hugging Face's T5 has 1
  std::string position_embedding_type = "learned_absolute";
  bool use_rotary_position_embeddings = false;  // legacy alias of --position-embedding-type rope
  bool add_position_embedding = true;           // false with the deprecated --no-position-embedding
  double rotary_base = 10000;
  double rotary_percent = 1.0;
  bool rotary_interleaved = false;
  bool use_rope_scaling = false;                        // Llama 3.1's frequency scaling
  double rope_scaling_factor = 8.0;                     // its factor
  double rotary_seq_len_interpolation_factor = kUnset;  // positions / factor
  std::string normalization = "LayerNorm";
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;  // norm weights centred on zero (gamma = 1 + weight)
  bool swiglu = false;
  bool gated_linear_unit = false;  // GeGLU
  bool openai_gelu = false;
  bool squared_relu = false;
  bool qk_layernorm = false;
  bool qk_l2_norm = false;   // --qk-l2-norm (Llama 4): weightless RMS norm of q and k heads
  std::string no_rope_freq;  // --no-rope-freq: N (every N-th layer) or a 0/1 list expression
  // gpt-oss's attention and MLP (Megatron core 0.19's TransformerConfig fields and flags).
  std::string window_size;               // --window-size "L,R"; empty: no sliding window
  std::string window_attn_skip_freq;     // N (every N-th layer full) or a 0/1 list (1: window)
  std::string softmax_type = "vanilla";  // vanilla, off-by-one or learnable (attention sinks)
  bool quick_geglu = false;
  double glu_linear_offset = 0.0;
  double activation_func_clamp_value = kUnset;  // None
  // YaRN on (non-MLA) attention, --position-embedding-type yarn (its factor is
  // --rotary-scaling-factor, its mscales --mscale and --mscale-all-dim, as under MLA).
  double yarn_original_max_position_embeddings = kUnset;  // None: 4096
  double yarn_beta_fast = kUnset;                         // None: 32
  double yarn_beta_slow = kUnset;                         // None: 1
  bool yarn_correction_range_round_to_int = true;
  // Hybrid Mamba models (--model mamba, transformer/mamba/mamba_config.h); Megatron's defaults.
  double hybrid_attention_ratio = 0.0;
  double hybrid_mlp_ratio = 0.0;
  std::string hybrid_override_pattern;  // deprecated spelling of --hybrid-layer-pattern
  // --hybrid-layer-pattern (core 0.17's unified form, transformer/mamba/hybrid_pattern.h):
  // "MAIN|MAIN/MTP/MTP"; empty: from the ratios.
  std::string hybrid_layer_pattern;
  std::string mtp_hybrid_override_pattern;  // legacy: one MTP depth's layers
  // Not a flag: the pattern's '|' segments' layer counts when it has more than one (the pipeline
  // layout they give), set by resolve_hybrid_pattern.
  std::vector<int64_t> hybrid_pipeline_segments;
  int64_t mamba_state_dim = 128;
  int64_t mamba_head_dim = 64;
  int64_t mamba_num_groups = 8;
  int64_t mamba_num_heads = 0;  // 0: None (2 hidden / head_dim)
  bool is_hybrid_model = false;
  // Heterogeneous layers (Llama-Nemotron; transformer/heterogeneous_config.h): a config.json with
  // "block_configs", by path or as its text (what checkpoints keep; read from the path if empty).
  std::string heterogeneous_layers_config_path;
  std::string heterogeneous_layers_config_encoded_json;
  std::vector<std::string> spec;  // --spec: the module spec (Megatron's Mamba stack spec, local)
  // Multi-latent attention (transformer/mla_config.h); Megatron's defaults.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;  // 0: None (a full-rank query projection)
  int64_t kv_lora_rank = 32;
  int64_t qk_head_dim = 128;
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  std::string rope_type;       // rope or yarn; empty: yarn under MLA, rope otherwise
  int64_t mtp_num_layers = 0;  // multi-token prediction depths (Megatron's None: 0)
  double mtp_loss_scaling_factor = 0.1;
  bool mtp_use_repeated_layer = false;  // one MTP block applied at every depth (core 0.19)
  bool mtp_detach_heads = false;        // MTP losses train the MTP blocks only (core 0.19)
  bool init_method_xavier_uniform = false;
  double embedding_init_method_std = kUnset;  // unset: --init-method-std
  bool fp32_residual_connection = false;      // the residual stream is fp32 here always
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;
  bool untie_embeddings_and_output_weights = false;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_method_std = 0.02;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t padded_vocab_size = 0;  // --padded-vocab-size; 0: the vocabulary rounded up as above
  int64_t vocab_size = 0;         // NullTokenizer / mock data vocabulary

  // ---- training ----
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;  // 0: micro_batch_size * data-parallel size
  int64_t train_iters = 0;        // iteration-based training; computed from train_samples otherwise
  int64_t train_samples = 0;
  // --iterations-to-skip: Megatron's 0-based iteration counts (before the step) whose batch is
  // consumed without training.
  std::vector<std::string>
      iterations_to_skip;  // sample-based training (Megatron's update_train_iters); 0: unset
  std::vector<std::string> rampup_batch_size;  // START INCREMENT SAMPLES (train/batch_schedule.h)
  // --phase-transition-iterations "I1,I2,...": data phases (each job trains one phase on its own
  // data, reading it from its start, and saves and exits at the next transition); parsed into
  // phase_transitions, sorted.
  std::string phase_transition_iterations;
  std::vector<int64_t> phase_transitions;
  bool decrease_batch_size_if_needed = false;  // round batches down to micro x dp multiples
  int64_t log_interval = 100;
  int64_t seed = 1234;
  bool bf16 = false;
  bool fp16 = false;
  double loss_scale = 0;                     // --loss-scale: constant fp16 scale; 0: dynamic
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;        // clean iterations before the dynamic scale doubles
  int64_t hysteresis = 2;                  // overflowing iterations tolerated before it halves
  bool attention_softmax_in_fp32 = false;  // accepted: softmax always runs in fp32 here
  bool accumulate_allreduce_grads_in_fp32 = false;  // accepted: gradients are always fp32
  bool grad_reduce_in_bf16 = false;                 // data-parallel gradient reduction in bf16
  bool ddp_reduce_scatter_with_fp32_accumulation = false;  // all-to-all, then an fp32 local sum
  // Accepted: every parameter's gradients accumulate in fp32 here.
  std::vector<std::string> ddp_param_name_patterns_for_fp32_local_accumulation;
  // FP8 GEMMs (parallel/fp8_scaling.h), Megatron's Transformer Engine flags.
  std::string fp8_format;                             // --fp8-format e4m3|hybrid ("": off)
  std::string fp8_recipe = "delayed";                 // --fp8-recipe delayed|tensorwise
  int64_t fp8_margin = 0;                             // --fp8-margin
  int64_t fp8_amax_history_len = 1;                   // --fp8-amax-history-len
  std::string fp8_amax_compute_algo = "most_recent";  // --fp8-amax-compute-algo
  bool no_fp8_wgrad = false;                          // --no-fp8-wgrad
  bool first_last_layers_bf16 = false;                // --first-last-layers-bf16
  int64_t num_layers_at_start_in_bf16 = 1;            // --num-layers-at-start-in-bf16
  int64_t num_layers_at_end_in_bf16 = 1;              // --num-layers-at-end-in-bf16
  bool fp8_param_gather = false;  // --fp8-param-gather: FP8 weights kept and gathered as FP8
  // --reuse-grad-buf-for-mxfp8-param-ag: Megatron's memory layout for MXFP8's bf16 gather
  bool reuse_grad_buf_for_mxfp8_param_ag = false;

  // ---- optimizer and schedule ----
  // adam (AdamW), sgd (momentum SGD), muon (Muon + AdamW) or onebit_adam (DeepSpeed's 1-bit Adam)
  std::string optimizer = "adam";
  double sgd_momentum = 0.9;            // --sgd-momentum (Megatron's default)
  int64_t onebit_freeze_step = 100000;  // --onebit-freeze-step (DeepSpeed's freeze_step)
  // --optimizer muon (optim/muon.h; Megatron core 0.19's flags and defaults)
  double muon_momentum = 0.9;                     // --muon-momentum
  bool muon_split_qkv = true;                     // --muon-no-split-qkv
  bool muon_nesterov = false;                     // --muon-nesterov
  std::string muon_scale_mode = "spectral";       // --muon-scale-mode
  std::string muon_fp32_matmul_prec = "medium";   // --muon-fp32-matmul-prec
  std::string muon_coefficient_type = "quintic";  // --muon-coefficient-type
  int64_t muon_num_ns_steps = 5;                  // --muon-num-ns-steps
  std::string muon_tp_mode = "blockwise";         // --muon-tp-mode
  double muon_extra_scale_factor = 1.0;           // --muon-extra-scale-factor
  std::string muon_scalar_optimizer = "adam";     // --muon-scalar-optimizer
  double lion_beta1 = 0.95;                       // --lion-beta1 (--optimizer lion)
  double lion_beta2 = 0.98;                       // --lion-beta2
  // MuonClip's qk-clip (train/qk_clip.h; Megatron core 0.19's TransformerConfig fields): after
  // each step every query group's query and key rows of linear_qkv shrink so that its largest
  // attention score of the step would have been at most the threshold.
  // --apply-wd-to-qk-layernorm (or the deprecated --no-weight-decay-cond-type
  // apply_wd_to_qk_layernorm): q_layernorm and k_layernorm weights decay too (Qwen3-Next).
  bool apply_wd_to_qk_layernorm = false;
  std::string no_weight_decay_cond_type;
  bool qk_clip = false;                  // --qk-clip
  double qk_clip_alpha = 0.5;            // --qk-clip-alpha: the queries' share of the shrink
  double qk_clip_threshold = 100;        // --qk-clip-threshold
  bool log_max_attention_logit = false;  // --log-max-attention-logit
  // Muon's layer-wise distributed optimizer (optim/muon.h): set by argument validation from
  // --use-distributed-optimizer (which it then clears, as Megatron does) or --optimizer dist_muon.
  bool use_layer_wise_distributed_optimizer = false;
  // --use-precision-aware-optimizer: the Adam moments stored in --exp-avg-dtype /
  // --exp-avg-sq-dtype (fp32, fp16, bf16, fp8; optim/moment_storage.h), distributed optimizer only
  bool use_precision_aware_optimizer = false;
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  double lr = 0;
  double min_lr = 0;
  std::string lr_decay_style = "linear";
  int64_t lr_decay_iters = 0;  // 0: train_iters
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_samples = 0;  // sample-based decay length; 0: train_samples
  int64_t lr_warmup_samples = 0;
  int64_t lr_wsd_decay_samples = 0;
  double lr_warmup_fraction = -1;  // < 0: unset
  double lr_warmup_init = 0;
  int64_t lr_wsd_decay_iters = 0;
  std::string lr_wsd_decay_style = "exponential";
  double weight_decay = 0.01;
  double start_weight_decay = kUnset;  // with --weight-decay-incr-style linear or cosine
  double end_weight_decay = kUnset;
  std::string weight_decay_incr_style = "constant";
  double decoupled_lr = kUnset;      // LR of the word embeddings and output layer; unset: --lr
  double decoupled_min_lr = kUnset;  // their minimum; unset: --min-lr
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  bool check_for_nan_in_loss_and_grad = true;
  // Megatron's rerun state machine (train/rerun_state_machine.h) and its further validations.
  bool check_for_spiky_loss = false;
  bool check_for_large_grads = false;
  std::string rerun_mode = "validate_results";  // disabled | validate_results | report_stats
  int64_t error_injection_rate = 0;
  std::string error_injection_type = "transient_error";
  std::string result_rejected_tracker_filename;
  bool calculate_per_token_loss = false;  // objective: mean over the global batch's tokens

  // ---- data ----
  bool mock_data = false;
  std::vector<std::string> data_path;  // one prefix, or a blend "w1 p1 w2 p2 ..."
  std::string split = "969, 30, 1";
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string data_args_path;            // a file holding --data-path's words
  std::string per_split_data_args_path;  // a JSON file {"train": ..., "valid": ..., "test": ...}
  std::string data_cache_path;
  // --per-dataset-sequences-path (core 0.19): the file, and what it says of each prefix
  // (sequences, documents + 1: the .idx header's two counts), checked against the .idx files.
  std::string per_dataset_sequences_path;
  std::map<std::string, std::pair<int64_t, int64_t>> sequences_per_dataset;
  bool dataloader_fast_cache_load = false;       // core 0.19; accepted (see its help)
  bool dataloader_defer_npy_index_mmap = false;  // core 0.19; accepted (see its help)
  std::string tokenizer_type = "NullTokenizer";
  std::string vocab_file, merge_file, tokenizer_model;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool allow_ambiguous_pad_tokens = false;  // mask a pad id shared with another special token
  bool dataloader_inter_document_masking = false;       // documents from the dataset, not from EOD
  int64_t null_tokenizer_eod_id = -1;                   // NullTokenizer's EOD; -1: vocab_size - 1
  int64_t null_tokenizer_pad_id = -1;                   // NullTokenizer's pad; -1: none
  bool tokenizer_hf_no_include_special_tokens = false;  // Megatron core 0.19
  // Megatron core 0.19's Maximal Update Parameterization (--use-mup, --mup-*).
  bool attention_output_gate = false;  // Megatron core 0.19
  bool use_mup = false;
  double mup_width_mult = 1;         // computed, as Megatron overwrites it
  int64_t mup_base_hidden_size = 0;  // 0: the hidden size
  double mup_embedding_mult = 1, mup_output_mult = 1;
  double mup_base_head_dim = 0;  // 0: none (Megatron's Optional[float])
  double mup_attn_scale_power = 1;
  // Fill-in-the-middle data (--fim-data, data/fim_dataset.h)
  bool fim_data = false;
  double fim_rate = 0.5, fim_spm_rate = 0.5;
  double fim_fragment_rate = std::numeric_limits<double>::quiet_NaN();  // unset
  std::string fim_split_sample, fim_no_prefix;                          // "": unset
  std::string fim_prefix_token = "<fim_prefix>", fim_middle_token = "<fim_middle>";
  std::string fim_suffix_token = "<fim_suffix>", fim_pad_token = "<fim_pad>";
  std::string fim_eod_token = "<|endoftext|>";
  // BERT (--model bert / pretrain_bert)
  double mask_prob = 0.15;                        // --mask-prob
  double short_seq_prob = 0.1;                    // --short-seq-prob
  bool bert_no_binary_head = false;               // --bert-no-binary-head
  std::string transformer_block_type = "pre_ln";  // --transformer-block-type
  int64_t vocab_extra_ids = 0;                    // --vocab-extra-ids
  std::string tiktoken_pattern;                   // TikTokenizer: v1 | v2
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tiktoken_special_tokens;  // empty: <unk> <s> </s>
  // Finetuning (`megatron finetune`, Megatron's tasks/main.py)
  std::string task;                     // --task: classification, MNLI, QQP
  std::vector<std::string> train_data;  // --train-data
  std::vector<std::string> valid_data;  // --valid-data
  int64_t epochs = 0;                   // --epochs (sets --train-iters)
  int64_t num_classes = 0;              // from the task and the training data
  int64_t num_workers = 2;              // background batch preparation (0: in the training thread)
  // --dataloader-type: single (Megatron's sequential sampler) or cyclic (its random sampler,
  // epoch after epoch; data/random_sampler.h), and its --no-data-sharding.
  std::string dataloader_type = "single";
  // --sft: supervised finetuning on JSON-lines conversations (data/sft_dataset.h), with
  // --tokenizer-type SFTTokenizer and this chat template.
  bool sft = false;
  std::string sft_tokenizer_prompt_format = "nemotron-h-aligned";
  bool data_sharding = true;

  // ---- evaluation ----
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  // --full-validation: each evaluation reads the whole validation set once (one epoch of it);
  // --multiple-validation-sets: one set per --valid-data-path prefix, evaluated and logged apart.
  bool full_validation = false;
  bool multiple_validation_sets = false;
  // Megatron core 0.19's validation flags: the evaluation's batch sizes (0: the training ones),
  // the first iteration the loop evaluates at (0: from the first --eval-interval), the sets' names.
  int64_t eval_micro_batch_size = 0, eval_global_batch_size = 0;
  int64_t start_eval_at_iter = 0;
  std::vector<std::string> validation_set_names;
  double mid_level_dataset_surplus = 0.005;  // blends: extra share of each dataset's samples
  bool skip_train = false;  // evaluate the loaded checkpoint on validation and test data only

  // ---- checkpoints (see src/train/checkpointing.h) ----
  std::string pretrained_checkpoint;  // Hugging Face model directory to start from
  // --pretrained-vision-checkpoint: a Hugging Face CLIP directory for LLaVA's vision encoder.
  std::string pretrained_vision_checkpoint;
  std::string save;                       // --save: checkpoint root; empty: no checkpoints
  std::string load;                       // --load: checkpoint root to resume from
  int64_t save_interval = 0;              // iterations between saves; 0: only at the end
  int64_t persistent_save_interval = -1;  // Megatron's other name of --save-interval; -1: unset
  int64_t save_retain_interval = 0;       // keep only these multiples (and the latest); 0: keep all
  // Non-persistent checkpoints (Megatron's global type): every --non-persistent-save-interval
  // iterations that are not a --save-interval multiple, into --non-persistent-global-ckpt-dir
  // (default <save>/non_persistent), keeping the latest; a load takes the newer of the two.
  int64_t non_persistent_save_interval = 0;
  std::string non_persistent_ckpt_type;  // "", global (local needs NVIDIA's resiliency extension)
  std::string non_persistent_global_ckpt_dir;
  bool save_optim = true;  // false with --no-save-optim
  bool save_rng = true;    // false with --no-save-rng
  bool load_optim = true;  // false with --no-load-optim
  bool load_rng = true;    // false with --no-load-rng
  // --load-main-params-from-ckpt: the fp32 main weights from the checkpoint under
  // --no-load-optim; checkpoints here hold the main weights, so every load does that.
  bool load_main_params_from_ckpt = false;
  bool finetune = false;  // load weights only, start at iteration 0
  // --override-ckpt-iteration: the loaded checkpoint's iteration replaced by this one, its
  // consumed samples by iteration x --global-batch-size (-1: keep the checkpoint's).
  int64_t override_ckpt_iteration = -1;
  int64_t check_weight_hash_across_dp_replicas_interval = 0;  // 0: never (train/replica_check.h)
  // On --load, the schedule's parameters: this run's (override), the checkpoint's
  // (use_checkpoint), or, with neither, this run's, which must equal the checkpoint's.
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  bool exit_on_missing_checkpoint = false;
  bool use_checkpoint_args = false;  // model-shape arguments from the --load checkpoint
  // With it, the saving run's --tokenizer-model (and TikTokenizer settings) too.
  bool use_tokenizer_model_from_checkpoint_args = true;
  bool use_mp_args_from_checkpoint_args = false;  // with it, the model-parallel sizes too
  int64_t ckpt_step = -1;                  // --ckpt-step: load this iteration, not the tracker's
  bool async_save = false;                 // write checkpoints on a background thread
  bool verify_integrity = false;           // on load, also compare the shard files' SHA-256
  bool no_verify_integrity = false;        // on load, skip the per-tensor XXH3-64 checksums
  std::string ckpt_format = "torch_dist";  // accepted: the one (sharded, reshardable) format

  // ---- graceful exits and hang detection ----
  bool exit_signal_handler = false;     // save and exit when --exit-signal arrives
  std::string exit_signal = "SIGTERM";  // the signal --exit-signal-handler waits for
  int64_t exit_interval = 0;            // exit (after saving) at iterations divisible by this
  double exit_duration_in_mins = 0;     // exit (after saving) once training ran this long
  double distributed_timeout_seconds_after_init = 0;  // core 0.19; 0: the minutes' limit stays
  int64_t log_memory_interval = 0;                    // core 0.19; 0: the first interval only
  double distributed_timeout_minutes = 10;  // watchdog: a step or collective hanging this long

  // ---- logging ----
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  bool log_throughput = false;
  bool log_params_norm = false;        // "params norm" in the iteration line and TensorBoard
  bool log_num_zeros_in_grad = false;  // "num zeros" of the gradients
  bool log_progress = false;           // SAVE/progress.txt (Megatron's progress log)
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;  // false with --no-log-loss-scale-to-tensorboard
  std::string save_hf;          // write the trained weights as a Hugging Face directory
  int64_t num_threads = 0;      // OpenMP threads; 0: cores available to this rank
  std::string device = "auto";  // cpu, cuda, or auto: cuda where a GPU is visible, else cpu
  bool tf32 = false;            // f32 GEMMs on a GPU may use TF32 tensor cores

  // ---- parallelism (data parallel = world size / (tensor x pipeline)) ----
  int64_t tensor_model_parallel_size = 1;    // ranks sharing each layer's weights (Megatron's TP)
  int64_t pipeline_model_parallel_size = 1;  // pipeline stages (split: pipeline/layer_split.h)
  int64_t decoder_first_pipeline_num_layers = 0;         // layers of the first stage; 0: even split
  int64_t decoder_last_pipeline_num_layers = 0;          // layers of the last stage; 0: even split
  bool account_for_embedding_in_pipeline_split = false;  // the embedding counts as a layer
  bool account_for_loss_in_pipeline_split = false;       // the loss counts as a layer
  std::string pipeline_model_parallel_layout;  // every virtual stage spelled out ("Et|tt|tL")
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // interleaved 1F1B chunk size; 0: none
  int64_t num_virtual_stages_per_pipeline_rank = 0;   // chunks per stage (V) directly; 0: none
  // Micro-batches that run on one virtual stage before the next (the interleaved schedule's
  // group, pipeline/schedule.h); 0: the pipeline size, Megatron's default.
  int64_t microbatch_group_size_per_vp_stage = 0;
  bool sequence_parallel = false;     // shard norms/dropout along s over TP; forced off at TP 1
  bool use_tp_pp_dp_mapping = false;  // --use-tp-pp-dp-mapping: rank order tp-cp-ep-pp-dp
  int64_t context_parallel_size =
      1;  // ranks splitting every sequence (parallel/context_parallel.h)
  std::vector<std::string> cp_comm_type = {"p2p"};  // p2p|allgather|a2a|a2a+p2p, one or per layer
  std::vector<std::string> hierarchical_context_parallel_sizes;  // a2a+p2p: INNER OUTER
  bool use_distributed_optimizer = false;  // ZeRO-1: Adam moments sharded over data parallel
  // Copies of the distributed optimizer over the data-parallel ranks (Megatron's partial
  // distributed optimizer): each shards over dp x cp / this many ranks.
  int64_t num_distributed_optimizer_instances = 1;
  bool test_mode = false;  // --test-mode: the query/key norms' replicas compared every iteration
  // Megatron-FSDP: per-layer buffers; no_shard, optim (ZeRO-1), optim_grads (ZeRO-2),
  // optim_grads_params (ZeRO-3).
  bool use_megatron_fsdp = false;
  // --use-torch-fsdp2: PyTorch's FSDP2 (ZeRO-3 over data x context parallelism), run here by
  // Megatron-FSDP's optim_grads_params (optim_grads with --torch-fsdp2-no-reshard-after-forward).
  bool use_torch_fsdp2 = false;
  bool torch_fsdp2_reshard_after_forward = true;
  std::string data_parallel_sharding_strategy = "no_shard";
  bool overlap_grad_reduce = false;   // reduce each gradient bucket as soon as it is complete
  bool overlap_param_gather = false;  // gather updated weights during the next forward
  int64_t ddp_bucket_size = 0;        // elements; 0: Megatron's max(40000000, 1000000 x dp size)
  int64_t ddp_num_buckets = -1;       // buckets of this rank's parameters instead; -1: unset
  double gemm_peak_gflops = 0;        // MFU denominator; 0: measured at start-up
  int64_t timing_log_level = 0;       // 0: no step-time report; 1-2: phases (see step_timers.h)
  std::string inject_fault;           // testing hook "KIND:RANK:ITERATION"; empty: none

  // ---- mixture of experts (transformer/moe/moe_config.h; Megatron's _add_moe_args) ----
  int64_t num_experts = 0;                // experts per MoE layer; 0: dense
  bool moe_use_upcycling = false;         // --moe-use-upcycling: --load's dense model as this MoE
  int64_t moe_upcycling_granularity = 1;  // the dense FFN width / the experts' width
  std::string moe_layer_freq = "1";       // N, or a list expression such as ([0]*3+[1]*5)
  int64_t moe_ffn_hidden_size = 0;        // per-expert FFN width; 0: --ffn-hidden-size
  int64_t moe_shared_expert_intermediate_size = 0;  // total shared-expert width; 0: none
  int64_t moe_latent_size = 0;                      // routed experts' width (LatentMoE); 0: none
  bool moe_shared_expert_overlap = false;
  bool moe_shared_expert_gate = false;  // Megatron core 0.19
  int64_t moe_router_topk = 2;
  std::string moe_router_score_function = "softmax";  // softmax or sigmoid
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = kUnset;
  int64_t moe_router_num_groups = 0;  // group-limited routing; 0: none
  int64_t moe_router_group_topk = 0;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  std::string moe_router_dtype;  // fp32 or fp64; empty: the compute dtype
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  std::vector<std::string> moe_aux_loss_coeff = {"0.0"};  // one per load-balancing type
  double moe_z_loss_coeff = kUnset;
  double moe_input_jitter_eps = kUnset;
  bool moe_router_force_load_balancing = false;  // benchmark-only random routing
  bool moe_apply_probs_on_input = false;         // probabilities scale the experts' input
  bool moe_router_padding_for_fp8 = false;       // experts' tokens padded to FP8's multiple
  double moe_expert_capacity_factor = kUnset;    // unset or negative: dropless
  std::string moe_token_drop_policy = "probs";   // probs or position
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_dispatcher_type = "allgather";  // allgather or alltoall
  bool moe_grouped_gemm = false;
  bool moe_per_layer_logging = false;
  bool log_expert_load = false;             // ours: "expert load max/mean" in the iteration line
  int64_t expert_model_parallel_size = 1;   // EP
  int64_t expert_tensor_parallel_size = 0;  // ETP; 0: --tensor-model-parallel-size

  // ---- activation recomputation (Megatron's flags; see TransformerBlock) ----
  std::string recompute_granularity;  // full or selective; empty: none
  std::string recompute_method;       // uniform or block (with full); empty: none
  int64_t recompute_num_layers = 0;   // layers per chunk (uniform) / per stage (block); 0: unset
  bool distribute_saved_activations = false;  // kept segment inputs split over the TP ranks
  bool recompute_activations = false;  // deprecated alias of --recompute-granularity selective
  // --recompute-modules (with selective); unset: Megatron's default, core_attn.
  std::vector<std::string> recompute_modules;
  bool moe_layer_recompute = false;  // deprecated: selective with the moe module

  // ---- record ----
  // Every argument as the argument table holds it ({dest: value}, filled by the CLI after
  // parsing), saved in checkpoints as "arguments"; --use-checkpoint-args restores its model
  // concern from there.
  nlohmann::json argument_record = nlohmann::json::object();
  // Not a flag: this node's ranks per core (>= 1; above 1 the ranks share cores), set by the
  // command from the MPI job for the planner's prediction.
  double ranks_per_core = 1;
  // Not a flag: this rank's device as the rerun state machine names it (its CUDA device, else
  // its local rank on the node), set by the command from the MPI job.
  int64_t device_index = 0;
};

// The pipeline's layer split of the flags (Megatron's uneven stages, pipeline/layer_split.h); a
// malformed --pipeline-model-parallel-layout throws InvalidArgument naming it.
inline PipelineSplit pipeline_split(const Arguments& a) {
  PipelineSplit s{a.decoder_first_pipeline_num_layers,
                  a.decoder_last_pipeline_num_layers,
                  a.account_for_embedding_in_pipeline_split,
                  a.account_for_loss_in_pipeline_split,
                  {}};
  if (!a.pipeline_model_parallel_layout.empty())
    s.layout = parse_pipeline_layout(a.pipeline_model_parallel_layout);
  if (!a.hybrid_pipeline_segments.empty()) s.layout = a.hybrid_pipeline_segments;
  return s;
}

// Model chunks per pipeline rank (Megatron's virtual_pipeline_model_parallel_size): 1 without
// interleaving; (num_layers / pp) / --num-layers-per-virtual-pipeline-stage (the embedding and
// loss counted in when the split counts them), --num-virtual-stages-per-pipeline-rank, or the
// layout's stages over pp. Assumes the arguments passed validation (train_args).
inline int64_t virtual_pipeline_stages(const Arguments& a) {
  if (!a.pipeline_model_parallel_layout.empty() || !a.hybrid_pipeline_segments.empty()) {
    return static_cast<int64_t>(pipeline_split(a).layout.size()) /
           std::max<int64_t>(1, a.pipeline_model_parallel_size);
  }
  if (a.num_layers_per_virtual_pipeline_stage > 0) {
    return split_units(a.num_layers, pipeline_split(a)) / a.pipeline_model_parallel_size /
           a.num_layers_per_virtual_pipeline_stage;
  }
  if (a.num_virtual_stages_per_pipeline_rank > 0) return a.num_virtual_stages_per_pipeline_rank;
  return 1;
}

}  // namespace megatron
