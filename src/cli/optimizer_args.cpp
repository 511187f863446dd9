// The precision-aware optimizer's flags of `megatron train` (Megatron's
// --use-precision-aware-optimizer, --exp-avg-dtype, --exp-avg-sq-dtype) and Megatron's rules for
// them. What they do is optim/moment_storage.h's.
#include "cli/train_args.h"
#include "core/error.h"
#include "optim/moment_storage.h"

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

}  // namespace megatron::cli
