// The Megatron-FSDP flags of `megatron train` (--use-megatron-fsdp,
// --data-parallel-sharding-strategy) and their checks. What they do is parallel/fsdp.h's and the
// distributed optimizer's; the trainer picks the buffers' layout from them.
#include "cli/train_args.h"
#include "core/error.h"

namespace megatron::cli {

void register_fsdp_args(ArgTable& t, Arguments& a) {
  t.flag("--use-torch-fsdp2", a.use_torch_fsdp2,
         "PyTorch's FSDP2 (weights, gradients and optimizer state sharded over the data-parallel "
         "ranks, ZeRO-3): run by Megatron-FSDP's optim_grads_params, the same sharding and "
         "numbers");
  t.negative_flag("--torch-fsdp2-no-reshard-after-forward", "torch_fsdp2_reshard_after_forward",
                  a.torch_fsdp2_reshard_after_forward,
                  "With --use-torch-fsdp2: keep the gathered weights from forward to backward "
                  "(run as optim_grads, which keeps them whole; the same numbers)");
  t.flag("--use-megatron-fsdp", a.use_megatron_fsdp,
         "Megatron-FSDP: data parallelism over per-layer flat buffers, sharded as "
         "--data-parallel-sharding-strategy says (implies the distributed optimizer unless "
         "no_shard)");
  t.add("--data-parallel-sharding-strategy", a.data_parallel_sharding_strategy,
        "With --use-megatron-fsdp: no_shard (plain data parallelism), optim (the optimizer state "
        "and main weights' updates, ZeRO-1), optim_grads (and the gradients, ZeRO-2) or "
        "optim_grads_params (and the weights, gathered per layer around each use, ZeRO-3)");
}

void validate_fsdp_args(Arguments& a) {
  // (--torch-fsdp2-no-reshard-after-forward alone changes nothing, as in Megatron.)
  if (a.use_torch_fsdp2) {
    // Megatron's assertions, then FSDP2's sharding through Megatron-FSDP.
    MEGATRON_CHECK(a.pipeline_model_parallel_size == 1,
                   "--use-torch-fsdp2 is not supported with pipeline parallelism");
    MEGATRON_CHECK(!a.use_megatron_fsdp && !a.use_distributed_optimizer,
                   "--use-torch-fsdp2 shards the optimizer itself: drop --use-megatron-fsdp and "
                   "--use-distributed-optimizer");
    a.use_megatron_fsdp = true;
    a.data_parallel_sharding_strategy =
        a.torch_fsdp2_reshard_after_forward ? "optim_grads_params" : "optim_grads";
  }
  const std::string& s = a.data_parallel_sharding_strategy;
  MEGATRON_CHECK(a.check_weight_hash_across_dp_replicas_interval >= 0,
                 "--check-weight-hash-across-dp-replicas-interval must be >= 0 (0: never), got ",
                 a.check_weight_hash_across_dp_replicas_interval);
  MEGATRON_CHECK(!(a.use_megatron_fsdp && s == "optim_grads_params" &&
                   a.check_weight_hash_across_dp_replicas_interval > 0),
                 "check_weight_hash_across_dp_replicas_interval is not supported with "
                 "optim_grads_params: the data-parallel ranks hold different shards of the "
                 "weights; drop --check-weight-hash-across-dp-replicas-interval");
  MEGATRON_CHECK(!(a.use_megatron_fsdp && s == "optim_grads_params" && a.test_mode),
                 "--test-mode compares the query/key norms' weights across data-parallel "
                 "replicas, which optim_grads_params shards: drop --test-mode");
  MEGATRON_CHECK(s == "no_shard" || s == "optim" || s == "optim_grads" || s == "optim_grads_params",
                 "--data-parallel-sharding-strategy must be no_shard, optim, optim_grads or "
                 "optim_grads_params, got '",
                 s, "'");
  if (!a.use_megatron_fsdp) {
    MEGATRON_CHECK(s == "no_shard", "--data-parallel-sharding-strategy ", s,
                   " shards through Megatron-FSDP: add --use-megatron-fsdp (or use "
                   "--use-distributed-optimizer for ZeRO-1 without it)");
    return;
  }
  // Megatron-FSDP (v1) runs on the distributed optimizer; with no_shard nothing is sharded and
  // it is plain data parallelism.
  a.use_distributed_optimizer = s != "no_shard";
  MEGATRON_CHECK(a.optimizer != "onebit_adam", "--use-megatron-fsdp with --optimizer ", a.optimizer,
                 ": 1-bit Adam averages whole momenta, which Megatron-FSDP's sharding splits; use "
                 "--optimizer adam or sgd");
}

}  // namespace megatron::cli
