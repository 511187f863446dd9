// FsdpRuntime: Megatron-FSDP's runtime for the strategies that shard more than the optimizer
// state (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads | optim_grads_params).
//
// The ParamSet is laid out in one bucket per FSDP unit (BucketLayout::per_unit: each transformer
// layer, the embeddings, the final norm, the output layer) and sharded (Sharding): every
// data-parallel rank keeps its 1/dp shard of each unit's gradients (optim_grads, ZeRO-2) and of
// its fp32 main and compute weights too (optim_grads_params, ZeRO-3). The model asks for a unit's
// parameters around each use, and this runtime lends it what the shards do not hold:
//
//   forward     wait_for(unit)   ZeRO-3: all-gather the unit's compute weights into a fresh
//                                buffer (or take the one prefetched) and point the Params at it;
//                                start gathering the next unit (the one before it in buffer
//                                order, which is the next layer: buffers are laid out in reverse)
//                                A unit is one bucket, or two with --fp8-param-gather (its FP8
//                                weights' codes sit in a bucket of their own, after all others);
//                                its buckets are gathered, prefetched and dropped together.
//               release(unit)    ZeRO-3: drop the gathered weights once no forward reads them
//   backward    before_backward  ZeRO-3: gather again (prefetching the unit after it in buffer
//                                order, the next one backward reaches); both: a zeroed full
//                                fp32 gradient buffer for the unit, which its backward adds to
//               after_backward   once every Param of the unit is reported: its gradients of this
//                                micro-batch are averaged and reduce-scattered into this rank's
//                                shard (GradBuckets::reduce_scatter_add, asynchronous), the
//                                buffer is dropped, and (ZeRO-3) so are the weights
//
// Gradients are reduced after every micro-batch's backward, as Megatron-FSDP does for these two
// strategies (the full gradients are never held for a whole step), so a step with m micro-batches
// reduce-scatters m times. A unit whose Params were not all reported in a backward (a module
// that does not report) is reduced at finish(), still correctly, only later.
//
// Reference counts make nested and repeated uses safe: a unit read by two modules (tied
// embeddings: the embedding and the output layer) is gathered while either holds it. Every
// collective is issued in program order, which is the same on every rank of a unit's group (the
// data-parallel group, or the expert-data-parallel group for experts), so they pair up.
//
// Not here: the optimizer step on the shards (DistributedOptimizer), the checkpoint boxes
// (train/checkpointing.cpp saves and loads each rank's shards).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "parallel/param_gate.h"

namespace megatron {

class FsdpRuntime final : public ParamGate {
 public:
  // buckets: per-unit reduce-scatter buckets over a ParamSet built with Sharding::grads; both
  // must outlive this object. inner: another gate
  // asked first (the distributed optimizer's --overlap-param-gather when the weights are not
  // sharded).
  FsdpRuntime(GradBuckets& buckets, const ParamGate* inner = nullptr);
  ~FsdpRuntime() override;

  void wait_for(const std::vector<const Param*>& params) const override;
  void release(const std::vector<const Param*>& params) const override;
  // The backward hooks (ParamsDone's before and after).
  void before_backward(const std::vector<const Param*>& params);
  void after_backward(const std::vector<const Param*>& params);
  // End of a step's backward passes: reduces every unit still open, then waits for every
  // reduction (GradBuckets::finish), and drops whatever is still gathered.
  void finish();

  bool shards_weights() const { return params_.weights_sharded(); }
  // Counters: all-gathers issued, and the most bytes of gathered weights plus lent gradient
  // buffers held at once (the working set above the shards).
  int64_t gathers() const { return gathers_; }
  int64_t peak_lent_bytes() const { return peak_lent_; }
  // Seconds waiting for all-gathers (what prefetching did not hide).
  double gather_wait_seconds() const { return gather_wait_; }

 private:
  struct Unit {
    Tensor weights;          // gathered compute weights (ZeRO-3), undefined when not held
    Work gather;             // in flight into `weights`
    bool gathering = false;  // `gather` not waited for yet
    int forward_refs = 0;    // forwards reading the weights now
    bool in_backward = false;
    Tensor grads;                // lent gradient buffer while in_backward
    std::vector<char> reported;  // per Param of the bucket: finished in this backward
    int64_t num_reported = 0;
  };
  // The distinct buckets of `params`, in order of first appearance.
  std::vector<int64_t> buckets_of(const std::vector<const Param*>& params) const;
  void start_gather(int64_t b) const;
  void ensure_weights(int64_t b) const;
  void maybe_drop(int64_t b) const;
  // The lowest and highest unit index of `buckets` (non-empty).
  std::pair<int64_t, int64_t> unit_range(const std::vector<int64_t>& buckets) const;
  // Starts gathering the buckets of unit u (an index in unit order, see unit_of_).
  void prefetch(int64_t u) const;
  void close_backward(int64_t b);
  void account(int64_t delta) const;

  GradBuckets& buckets_;
  ParamSet& params_;
  const ParamGate* inner_;
  // Mutable: the forward's gate is const (ParamGate); the lending is bookkeeping, not model state.
  mutable std::vector<Unit> units_;
  // Per bucket, its unit's index, units numbered in buffer order of their first bucket; and each
  // unit's buckets.
  std::vector<int64_t> unit_of_;
  std::vector<std::vector<int64_t>> unit_buckets_;
  mutable int64_t prefetched_ = -1;  // a unit gathered ahead and not used yet
  mutable int64_t gathers_ = 0;
  mutable int64_t lent_ = 0, peak_lent_ = 0;
  mutable double gather_wait_ = 0;
};

}  // namespace megatron
