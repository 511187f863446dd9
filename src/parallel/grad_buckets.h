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
// Distributed mode (GradReduce::kReduceScatter, --use-distributed-optimizer): the buckets are the
// ParamSet's padded buckets (ParamSet's BucketLayout constructor, see distributed_bucket_layout),
// each a multiple of dp elements long and cut into dp equal contiguous shards without regard to
// parameter boundaries: DP rank d owns shard d, [begin + d n, begin + (d + 1) n) with
// n = (end - begin) / dp, of every bucket. A bucket is scaled by 1/dp and reduce-scattered in
// place, so after finish() the owned shards hold the mean gradient and every other element of the
// buffer is stale and must not be read (with the MPI backend it still holds this rank's own
// gradient times 1/dp; no promise): the distributed optimizer reads the owned shards only.
// Overlap works the same way.
//
// Several distributed-optimizer instances (--num-distributed-optimizer-instances K, Megatron's
// partial distributed optimizer): `dp` is then this rank's instance, dp x cp / K consecutive
// data-parallel ranks, and `inter` the K ranks holding the same shard in the K instances. A
// bucket is scaled by 1 / (|dp| K), reduce-scattered over the instance, and its shard all-reduced
// over `inter` (Megatron's two steps, the second after the first has finished): every instance
// ends with the whole mean in its shards, and holds the optimizer state for them. Megatron-FSDP's
// sharded gradients take the same second step (its hybrid sharding, HSDP: shards within an
// instance, replicas across).
//
// Padding: only the distributed layout pads (zeros at each bucket's end, to a multiple of
// lcm(16 dp, 128): Megatron's lcm(dp, 128) unless 16 divides dp, where it is larger so that every
// shard stays a multiple of 16 elements, 64-byte aligned as the parameters are). The padding lives
// in the ParamSet buffers, between two parameters, so every Param's views stay contiguous; the
// default ParamSet layout is untouched and the all-reduce mode works on either layout.
//
// Not here: the optimizer step on the shards (DistributedOptimizer), and sequence-parallel or
// embedding-group sums (other groups; the trainer does them after finish: they are sums, so on
// reduce-scattered buffers they are right on the owned shards as long as every member's shard
// holds the same elements, which the layout guarantees for the tied embeddings).
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "comm/process_group.h"
#include "parallel/param.h"

namespace megatron {

enum class GradReduce : uint8_t {
  kAllReduce,      // every replica gets the whole mean gradient (plain data parallelism)
  kReduceScatter,  // DP rank d gets the mean of shard d of every bucket (distributed optimizer)
};

// MoE experts split over EP ranks (or with ETP != TP): the expert-parallel parameters' buckets
// reduce over the expert-data-parallel group instead, pre-scaled by `scale` = 1 / (dp x cp)
// rather than 1 / |group| (Megatron's expert buffers: an expert on one EP rank already summed the
// tokens of its EP peers' samples, so the sum over its replicas divided by dp x cp is the mean
// over every sample). A null group: experts reduce like dense parameters.
struct ExpertReduction {
  ProcessGroup* group = nullptr;
  double scale = 1.0;
  // With several distributed-optimizer instances: `group` is this rank's instance of the
  // expert-data-parallel ranks and `inter` the ranks holding the same shard in the others.
  ProcessGroup* inter = nullptr;
};

class GradBuckets {
 public:
  // bucket_size: elements per bucket at least (the last bucket takes the rest); <= 0: one
  // bucket. kReduceScatter takes the buckets of a bucketed ParamSet, laid out with this
  // bucket_size and a padding that dp divides. params and dp must outlive this object.
  // inter: the inter-instance group (kReduceScatter, dense buckets only), or null.
  GradBuckets(ParamSet& params, ProcessGroup& dp, int64_t bucket_size, bool overlap,
              GradReduce reduce = GradReduce::kAllReduce, ExpertReduction expert = {},
              ProcessGroup* inter = nullptr);

  // --grad-reduce-in-bf16: each bucket is rounded to bf16 before its reduction and the reduced
  // values are bf16 (widened back into the fp32 buffer by finish()). Through ProcessGroup the sum
  // itself is taken in f32 and rounded once; a NCCL backend would also halve the traffic.
  void set_reduce_in_bf16(bool on) { reduce_in_bf16_ = on; }
  // --ddp-reduce-scatter-with-fp32-accumulation (Megatron core 0.19's
  // reduce_scatter_with_fp32_accumulation), kReduceScatter: a bucket's shards travel by an
  // all-to-all in the reduction dtype (bf16 with --grad-reduce-in-bf16: half the bytes of the f32
  // sum ProcessGroup reduces bf16 through) and each rank adds the group's copies of its shard in
  // f32, in rank order, rounding once (to bf16 with --grad-reduce-in-bf16, as Megatron writes
  // the sum into its bf16 buffer). Sharded gradients (reduce_scatter_add, Megatron-FSDP's) keep
  // the plain reduce-scatter (the trainer leaves this off under Megatron-FSDP, which ignores the
  // flag). At most one bucket's copies are held at a time: launching the next completes the
  // previous one (Megatron's previous_grad_reduce_bucket_group), whose gradients are final.
  void set_fp32_accumulation(bool on) { fp32_accumulation_ = on; }
  // false: sum the replicas' gradients instead of averaging them (--calculate-per-token-loss,
  // where the trainer divides by the global token count afterwards).
  void set_average(bool on) { average_ = on; }
  // false: no reduction at all, each rank keeps its own gradients (1-bit Adam's compressed
  // stage, which exchanges the momentum instead); mark_ready and finish then move nothing.
  void set_reduce(bool on) { reduce_enabled_ = on; }

  // Megatron-FSDP (optim_grads, optim_grads_params): the ParamSet keeps only this rank's shard of
  // every bucket of the gradients (Sharding, over the same groups as these buckets). Gradients
  // then never accumulate in a full buffer over the step: the FSDP runtime (parallel/fsdp.h)
  // hands each bucket's gradients of one backward to reduce_scatter_add, and mark_ready does
  // nothing. kReduceScatter only.
  bool grads_sharded() const { return params_.grads_sharded(); }
  // ZeRO-2: `full` ([bucket length] fp32) is bucket i's gradient of one backward; it is averaged
  // (scaled as the bucket is), reduce-scattered over the bucket's group, and the result added to
  // this rank's shard. Asynchronous: at most two are in flight (the older ones are completed
  // first, so that their full buffers are freed); finish() completes them all. `full` must not be
  // touched until then.
  void reduce_scatter_add(int64_t i, Tensor full);

  // Called with a bucket's index and its local gradients (of this rank, before any scaling)
  // just before they are reduced; under grads_sharded() once per backward with that backward's
  // gradients. Megatron's check_grads (the rerun state machine's validations) hooks in here.
  using Inspect = std::function<void(int64_t bucket, const Tensor& grads)>;
  void set_before_reduce(Inspect f) { before_reduce_ = std::move(f); }

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
  // The bucket holding p's gradient (and, in the distributed layout, its weights).
  int bucket_of(const Param& p) const;
  // [begin, end) of bucket i in the flat buffer.
  std::pair<int64_t, int64_t> bucket_range(int64_t i) const {
    return {buckets_[i].begin, buckets_[i].end};
  }
  // [begin, end) in the flat buffer of the part of bucket i whose mean this rank holds after
  // finish(): its shard under kReduceScatter, the whole bucket under kAllReduce.
  std::pair<int64_t, int64_t> shard_range(int64_t i) const {
    return {buckets_[i].shard_begin, buckets_[i].shard_end};
  }
  GradReduce reduce() const { return reduce_; }
  // The group bucket i reduces over (data parallel, or expert data parallel for an expert bucket
  // under ExpertReduction), whose ranks own its shards in kReduceScatter.
  ProcessGroup& group_of(int64_t i) const { return *buckets_[i].group; }
  ParamSet& params() const { return params_; }
  ProcessGroup& dp_group() const { return dp_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;              // range in ParamSet::grads()
    int64_t shard_begin = 0, shard_end = 0;  // this rank's part of it (see shard_range)
    int num_params = 0, ready = 0;
    bool launched = false;
    ProcessGroup* group = nullptr;  // where it is reduced
    ProcessGroup* inter = nullptr;  // then its shard summed over the instances, or null
    double scale = 1.0;             // applied before the sum when averaging
    Tensor view, shard;             // the ranges, as tensors
    Tensor low, low_shard;          // bf16 copies in flight with --grad-reduce-in-bf16
    Tensor gathered;                // fp32 accumulation: the group's copies of the shard
    Work work;
  };
  void launch(Bucket& b);
  // fp32 accumulation: waits for b's all-to-all and writes the sum of the copies into its shard.
  void complete_accumulation(Bucket& b);
  Bucket* accumulating_ = nullptr;  // the bucket whose copies are in flight, or null
  // reduce_scatter_add's transfers in flight, oldest first.
  struct Pending {
    int64_t bucket = 0;
    Tensor full, low, out;
    Work work;
  };
  std::vector<Pending> pending_;
  void complete_oldest();
  // The all-reduce of every bucket's shard over its inter-instance group (none: nothing).
  void sum_over_instances();

  ParamSet& params_;
  ProcessGroup& dp_;
  bool overlap_;
  bool reduce_in_bf16_ = false;
  bool fp32_accumulation_ = false;
  bool average_ = true;
  bool reduce_enabled_ = true;
  GradReduce reduce_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Param*, int> bucket_of_;
  std::unordered_map<const Param*, bool> ready_;  // marked this step
  Inspect before_reduce_;
};

// Megatron's default bucket size in elements: max(40,000,000, 1,000,000 x dp size).
int64_t default_ddp_bucket_size(int dp_size);

// The ParamSet layout that kReduceScatter needs for a data-parallel group of dp_size: buckets of
// bucket_size, each padded to a multiple of lcm(16 dp_size, 128) elements.
// expert_dp_size: the expert-data-parallel size when experts reduce over their own group
// (ExpertReduction), which the padding must divide too.
BucketLayout distributed_bucket_layout(int64_t bucket_size, int dp_size, int expert_dp_size = 1);

}  // namespace megatron
