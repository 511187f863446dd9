// ParamGate: what a forward pass asks before it reads some weights: "are these current?". The
// distributed optimizer with --overlap-param-gather answers it: after a step it only launches the
// all-gathers of the updated weights, bucket by bucket, and the next forward waits here for the
// buckets of the layer it is about to run (Megatron's forward pre-hooks), so the gathers of the
// later layers overlap the compute of the earlier ones.
#pragma once

#include <vector>

namespace megatron {

struct Param;

class ParamGate {
 public:
  virtual ~ParamGate() = default;
  // Returns once every weight of `params` holds its current value (compute copy included).
  virtual void wait_for(const std::vector<const Param*>& params) const = 0;
  // The forward that asked wait_for(params) is done reading them (Megatron-FSDP frees gathered
  // weights here). Every wait_for of a forward is followed by one release of the same set.
  virtual void release(const std::vector<const Param*>& params) const { (void)params; }
};

}  // namespace megatron
