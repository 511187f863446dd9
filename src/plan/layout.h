// Layout: one way to lay a training job over a cluster's devices, with Megatron's degrees.
//
// world = tp x cp x pp x dp; the experts of MoE layers are split ep ways with etp-way tensor
// parallelism inside each expert (etp x ep divides tp x cp x dp: Megatron's expert layout
// folds the attention's tp x cp x dp ranks into etp x ep x edp). m micro-batches of mbs
// sequences per data-parallel rank make the global batch: gbs = mbs x dp x m. What it is not: a
// placement of ranks on hosts (Megatron's rank order tp-cp-ep-dp-pp decides which groups stay
// inside a node; cost_model.h uses it).
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/layer_split.h"

namespace megatron::plan {

enum class Recompute : uint8_t { kNone, kSelective, kFull };
// The data-parallel sharding: plain DDP, the distributed optimizer (ZeRO-1), Megatron-FSDP with
// gradients and optimizer state sharded (ZeRO-2, optim_grads), or with the weights too (ZeRO-3,
// optim_grads_params).
enum class Sharding : uint8_t { kNone, kDistributedOptimizer, kFsdpGrads, kFsdp };

struct Layout {
  int64_t tp = 1, cp = 1, pp = 1, vpp = 1, ep = 1, etp = 1, dp = 1;
  int64_t mbs = 1;  // --micro-batch-size
  // --microbatch-group-size-per-virtual-pipeline-stage (interleaved schedule); 0: pp.
  int64_t vpp_group = 0;
  bool sp = false;  // --sequence-parallel (with tp > 1)
  Recompute recompute = Recompute::kNone;
  Sharding sharding = Sharding::kNone;
  bool overlap_grad_reduce = false;   // --overlap-grad-reduce
  bool overlap_param_gather = false;  // --overlap-param-gather
  std::string cp_comm_type = "p2p";   // --cp-comm-type
  PipelineSplit split = {};  // uneven pipeline stages (--decoder-first-pipeline-num-layers, ...)
  // --num-distributed-optimizer-instances: sharded state over dp / instances ranks, the gradient
  // shards then all-reduced across the instances.
  int64_t instances = 1;

  int64_t world() const { return tp * cp * pp * dp; }
  // Micro-batches per data-parallel rank for a global batch.
  int64_t microbatches(int64_t global_batch) const { return global_batch / (mbs * dp); }
};

const char* recompute_name(Recompute r);
const char* sharding_name(Sharding s);
// "tp2 sp cp1 pp2 vpp1 ep1 dp2 mbs1 rc=none dist-opt": the planner table's layout column.
std::string layout_name(const Layout& l);

}  // namespace megatron::plan
