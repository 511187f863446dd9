// Bytes per parameter of weights, gradients and optimizer state (see memory_model.h).
#include "plan/memory_model.h"

namespace megatron {

double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t shards,
                                            ShardedState sharded) {
  const double n = static_cast<double>(shards);
  auto share = [&](double bytes, bool split) { return split ? bytes / n : bytes; };
  // In fp32 runs the compute weights are the main weights (no copy).
  const double half_copy = is_half(compute_dtype) ? 2.0 : 0.0;
  return share(4.0, sharded.main) /* fp32 main */ + share(half_copy, sharded.compute) +
         share(4.0, sharded.grads) /* fp32 grad */ +
         share(sharded.moment_bytes, sharded.moments) /* Adam moments */;
}

}  // namespace megatron
