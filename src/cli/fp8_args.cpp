// The --fp8-* flags of `megatron train` (Megatron's Transformer Engine group) and their checks.
// What they do is parallel/fp8_scaling.h's; the GEMM-shape rule is checked with the finished
// model shape in train/model_config.cpp.
#include "cli/train_args.h"
#include "core/error.h"

namespace megatron::cli {

void register_fp8_args(ArgTable& t, Arguments& a) {
  t.add("--fp8-format", a.fp8_format,
        "FP8 GEMM inputs in every transformer layer's linear layers: e4m3 (every operand E4M3) "
        "or hybrid (E4M3 inputs and weights, E5M2 gradients); on the CPU the quantised values "
        "feed its bf16 GEMM (FP8's numerics, not its speed)");
  t.add("--fp8-recipe", a.fp8_recipe,
        "delayed (scales from an amax history), tensorwise (each tensor's own amax), mxfp8 (a "
        "power-of-two scale per 32 elements along each GEMM's reduction dimension) or blockwise "
        "(power-of-two scales per 1 x 128 block of activations and gradients, 128 x 128 of "
        "weights)");
  t.add("--fp8-margin", a.fp8_margin, "Delayed scaling: scales divided by 2^margin");
  t.add("--fp8-amax-history-len", a.fp8_amax_history_len,
        "Delayed scaling: amaxes kept per tensor");
  t.add("--fp8-amax-compute-algo", a.fp8_amax_compute_algo,
        "Delayed scaling: most_recent or max (of the history)");
  t.flag("--no-fp8-wgrad", a.no_fp8_wgrad,
         "Weight gradients from the unquantised input and output gradient (delayed scaling: "
         "Megatron passes it to no other recipe, which keep FP8 weight gradients)");
  t.alias("--disable-fp8-wgrad", "--no-fp8-wgrad");  // core 0.19's second spelling
  t.flag("--first-last-layers-bf16", a.first_last_layers_bf16,
         "Keep the first and last layers out of FP8 (a recipe other than delayed)");
  t.add("--num-layers-at-start-in-bf16", a.num_layers_at_start_in_bf16,
        "Layers at the start kept out of FP8 with --first-last-layers-bf16");
  t.add("--num-layers-at-end-in-bf16", a.num_layers_at_end_in_bf16,
        "Layers at the end kept out of FP8 with --first-last-layers-bf16");
  t.flag("--fp8-param-gather", a.fp8_param_gather,
         "Keep the FP8 GEMMs' weights as FP8 codes (one byte each, no bf16 copy), quantised from "
         "the fp32 main weights after each step and all-gathered as such (distributed optimizer "
         "or a sharded Megatron-FSDP strategy, --bf16)");
  t.flag("--reuse-grad-buf-for-mxfp8-param-ag", a.reuse_grad_buf_for_mxfp8_param_ag,
         "MXFP8 with --fp8-param-gather: Megatron all-gathers the bf16 weights through the "
         "gradient buffer's memory; here they are gathered in their bf16 compute copy (the same "
         "values)");
  // An FP8 setting rather than an architecture flag: checkpoints do not carry it, so one trained
  // with it loads without FP8 (conversion, generation in bf16); generation with --fp8-format
  // takes it as training does.
  t.flag("--moe-router-padding-for-fp8", a.moe_router_padding_for_fp8,
         "Pad each expert's tokens from a rank to a multiple of 16 (32 with --fp8-recipe mxfp8) "
         "with tokens routed to it with probability 0 (FP8 with the alltoall dispatcher; the "
         "padding enters the FP8 amaxes)");
  // Core 0.19's name for it (FP8 and FP4; FP4 is not implemented).
  t.alias("--moe-router-padding-for-quantization", "--moe-router-padding-for-fp8");
}

void validate_fp8_args(const Arguments& a) {
  // Megatron's DistributedDataParallelConfig assertion.
  MEGATRON_CHECK(!a.reuse_grad_buf_for_mxfp8_param_ag || a.fp8_param_gather,
                 "--reuse-grad-buf-for-mxfp8-param-ag: Reuse grad buffer only when keeping params "
                 "in MXFP8 (add --fp8-param-gather with --fp8-recipe mxfp8, or drop the flag)");
  if (a.fp8_param_gather) {
    MEGATRON_CHECK(!a.fp8_format.empty(),
                   "--fp8-param-gather keeps the FP8 GEMMs' weights in FP8: add --fp8-format or "
                   "drop it");
    // Megatron's rule; Megatron-FSDP's no_shard is plain data parallelism here, with no
    // distributed optimizer to quantise the shards.
    MEGATRON_CHECK(a.use_distributed_optimizer || a.use_torch_fsdp2 ||
                       (a.use_megatron_fsdp && a.data_parallel_sharding_strategy != "no_shard"),
                   "--fp8-param-gather only supported with distributed optimizer or megatron fsdp: "
                   "add --use-distributed-optimizer (or --use-megatron-fsdp with "
                   "--data-parallel-sharding-strategy optim, optim_grads or optim_grads_params)");
    MEGATRON_CHECK(a.bf16,
                   "--fp8-param-gather needs --bf16: its FP8 codes replace the bf16 compute copy "
                   "of the FP8 GEMMs' weights");
  }
  if (a.fp8_format.empty()) {
    MEGATRON_CHECK(!a.first_last_layers_bf16,
                   "--first-last-layers-bf16 applies to FP8 training: add --fp8-format or drop it");
    return;
  }
  MEGATRON_CHECK(a.fp8_format == "e4m3" || a.fp8_format == "hybrid",
                 "--fp8-format must be e4m3 or "
                 "hybrid, got '",
                 a.fp8_format, "'");
  MEGATRON_CHECK(a.fp8_recipe == "delayed" || a.fp8_recipe == "tensorwise" ||
                     a.fp8_recipe == "mxfp8" || a.fp8_recipe == "blockwise",
                 "--fp8-recipe ", a.fp8_recipe,
                 ": unknown recipe; choose delayed, tensorwise, mxfp8 or blockwise");
  MEGATRON_CHECK(a.fp8_amax_compute_algo == "most_recent" || a.fp8_amax_compute_algo == "max",
                 "--fp8-amax-compute-algo must be most_recent or max, got '",
                 a.fp8_amax_compute_algo, "'");
  MEGATRON_CHECK(a.fp8_amax_history_len >= 1, "--fp8-amax-history-len must be at least 1, got ",
                 a.fp8_amax_history_len);
  if (a.first_last_layers_bf16) {
    // Megatron's TransformerConfig rules.
    MEGATRON_CHECK(a.fp8_recipe != "delayed",
                   "Delayed scaling does not support first / last layer in BF16: "
                   "--first-last-layers-bf16 needs --fp8-recipe tensorwise, mxfp8 or blockwise");
    const int64_t per_stage = a.num_layers / a.pipeline_model_parallel_size;
    for (auto [flag, n] :
         {std::pair{"--num-layers-at-start-in-bf16", a.num_layers_at_start_in_bf16},
          std::pair{"--num-layers-at-end-in-bf16", a.num_layers_at_end_in_bf16}}) {
      MEGATRON_CHECK(n >= 0 && n <= per_stage, flag, " (", n,
                     ") must be between 0 and number of layers per pipeline stage (", per_stage,
                     ")");
    }
  }
}

}  // namespace megatron::cli
