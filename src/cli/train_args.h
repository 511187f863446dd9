// The `megatron train` flags: registration in the ArgTable, cross-flag validation, and merging a
// Hugging Face config.json (--pretrained-checkpoint) into the model flags.
#pragma once

#include "cli/arg_table.h"
#include "train/arguments.h"

namespace megatron::cli {

void register_model_args(ArgTable& t, Arguments& a);
void register_train_args(ArgTable& t, Arguments& a);
// The --fp8-* flags (part of register_train_args; cli/fp8_args.cpp) and their rules (part of
// validate_train_args).
void register_fp8_args(ArgTable& t, Arguments& a);
void validate_fp8_args(const Arguments& a);
void register_fsdp_args(ArgTable& t, Arguments& a);
// The rerun state machine's flags and the result validations (cli/rerun_args.cpp).
void register_rerun_args(ArgTable& t, Arguments& a);
void validate_rerun_args(const Arguments& a);
// The precision-aware optimizer's flags (cli/optimizer_args.cpp) and their rules, checked after
// validate_fsdp_args (which decides whether the distributed optimizer runs).
void register_precision_aware_args(ArgTable& t, Arguments& a);
void validate_precision_aware_args(const Arguments& a);
void register_muon_args(ArgTable& t, Arguments& a);
// Megatron's rewrite of --use-distributed-optimizer / dist_muon into the layer-wise distributed
// optimizer, then the checks; returns the warnings to log.
std::vector<std::string> validate_muon_args(Arguments& a);
// MuonClip's --qk-clip, --qk-clip-alpha, --qk-clip-threshold and --log-max-attention-logit
// (cli/optimizer_args.cpp), and Megatron's rules for them.
void register_qk_clip_args(ArgTable& t, Arguments& a);
// Returns the warnings to log.
std::vector<std::string> validate_qk_clip_args(const Arguments& a);
// May set use_distributed_optimizer (Megatron-FSDP runs on it).
void validate_fsdp_args(Arguments& a);
// Heterogeneous layers (cli/heterogeneous_args.cpp): reads --heterogeneous-layers-config-path
// into --heterogeneous-layers-config-encoded-json when that is empty, then Megatron's check that
// the flags repeat the config.json's model-level values. Runs before the legacy RoPE flag is
// folded into --position-embedding-type, as Megatron's does.
void validate_heterogeneous_args(Arguments& a);

// Checks every cross-flag rule, the parallel layout included (world size divisible by tp x pp,
// heads and query groups by tp, layers by pp and virtual stages, micro-batches by pp when
// interleaving); throws InvalidArgument naming the flags. Fills --global-batch-size when unset
// and turns --sequence-parallel off at tp 1 with Megatron's warning (printed by rank 0).
// world_size: MPI ranks of the job (the data-parallel size is derived from it); rank: this one.
// Pure arithmetic on the flags: every rank reaches the same verdict without communicating.
void validate_train_args(Arguments& a, int world_size = 1, int rank = 0);
// A hybrid model's unified --hybrid-layer-pattern (transformer/mamba/hybrid_pattern.h), as
// Megatron's validate_args takes it: --num-layers and --mtp-num-layers become the pattern's counts
// (returned: a line for each given value replaced), its '|' segments the pipeline layout
// (a.hybrid_pipeline_segments), with Megatron's refusals of the other layout flags beside '|'.
// Idempotent; nothing for other models. validate_train_args calls it first.
std::vector<std::string> resolve_hybrid_pattern(Arguments& a);

// Megatron's encoder-decoder aliases: --encoder-num-layers is --num-layers and
// --encoder-seq-length is --seq-length (one of each pair may be given); the decoder flags apply
// to --model t5 only, whose layouts (no pipeline, context parallelism or MoE) are checked here;
// training (not generation or scoring) also needs --decoder-seq-length and sentinels
// (--vocab-extra-ids). Run before the other checks.
void resolve_encoder_decoder(Arguments& a, const ArgTable& t, bool training);

// Fills the model flags from DIR/config.json. A model flag given explicitly that contradicts the
// file is an error naming both; flags left at their defaults yield to the file.
void merge_pretrained_config(Arguments& a, const ArgTable& t);
// `megatron finetune`: the classes from --task and --train-data, --epochs into --train-iters,
// and evaluations that cover --valid-data once (unless --eval-iters / --eval-interval say
// otherwise). Refuses the finetuning flags for other models.
void resolve_finetuning(Arguments& a, const ArgTable& t);
// --use-checkpoint-args: the model-shape arguments recorded in the --load checkpoint (the
// tracker's iteration, or --ckpt-step) replace the command line's, as Megatron's
// load_args_from_checkpoint does; a given flag that they override is reported. Reads files only.
void merge_checkpoint_args(Arguments& a, const ArgTable& t, bool report);

// --data-args-path and --per-split-data-args-path: the files' contents into --data-path and
// --train/valid/test-data-path (Megatron's get_blend_and_blend_per_split). Reads files only.
void read_data_args_files(Arguments& a);

// Sets --vocab-size from the tokenizer (files given by the tokenizer flags); with
// --pretrained-checkpoint, checks the tokenizer fits the checkpoint's vocabulary instead. Checks
// what else needs the tokenizer: NullTokenizer's ids, --fim-data's tokens.
void resolve_vocab_size(Arguments& a, const ArgTable& t);

}  // namespace megatron::cli
