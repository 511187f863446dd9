// GradBuckets: the data-parallel gradient reduction of Megatron's DistributedDataParallel over
// the contiguous fp32 gradient buffer of a ParamSet.
//
// The buffer is cut, at parameter boundaries, into buckets of at least `bucket_size` elements in
// buffer order. ParamSet lays parameters out in reverse registration order, so the first bucket
// holds the last layers, whose gradients backward finishes first (Megatron's reverse-order
// buckets). Each bucket is averaged over the data-parallel group: scaled by 1/dp, then
// all-reduced (sum), so every replica ends with the mean of the replicas' gradients.
//
// With overlap (--overlap-grad-reduce) the caller reports each parameter whose gradient is final
// (mark_ready, during the backward of a step's last micro-batch), and a bucket's all-reduce is
// launched asynchronously as soon as all its parameters are ready, while backward goes on with
// the earlier layers; poll() lets MPI advance the transfers in flight (Open MPI progresses
// nonblocking collectives only inside MPI calls). finish() launches whatever is left and waits.
// Without overlap, finish() reduces every bucket then. Either way the sums are the same.
//
// Not here: the distributed optimizer's reduce-scatter (it shards these same buckets), and
// sequence-parallel or embedding-group sums (other groups; the trainer does them after finish).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "comm/process_group.h"
#include "parallel/param.h"

namespace megatron {

class GradBuckets {
 public:
  // bucket_size: elements per bucket at least (the last bucket takes the rest); <= 0: one
  // bucket. params and dp must outlive this object.
  GradBuckets(ParamSet& params, ProcessGroup& dp, int64_t bucket_size, bool overlap);

  // Start of a step: nothing reduced, nothing ready.
  void reset();
  // p's gradient will not change again this step. Launches its bucket's reduction once the
  // bucket is complete (overlap only; otherwise a no-op).
  void mark_ready(const Param& p);
  // Lets in-flight reductions progress; returns at once.
  void poll();
  // Reduces every bucket not yet launched and waits for all of them.
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // [begin, end) of bucket i in the flat buffer.
  std::pair<int64_t, int64_t> bucket_range(int64_t i) const {
    return {buckets_[i].begin, buckets_[i].end};
  }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range in ParamSet::grads()
    int num_params = 0, ready = 0;
    bool launched = false;
    Tensor view;  // the range, as a tensor
    Work work;
  };
  void launch(Bucket& b);

  ParamSet& params_;
  ProcessGroup& dp_;
  bool overlap_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Param*, int> bucket_of_;
  std::unordered_map<const Param*, bool> ready_;  // marked this step
};

// Megatron's default bucket size in elements: max(40,000,000, 1,000,000 x dp size).
int64_t default_ddp_bucket_size(int dp_size);

}  // namespace megatron
