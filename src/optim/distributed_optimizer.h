// DistributedOptimizer: Megatron's distributed optimizer (--use-distributed-optimizer, ZeRO-1):
// AdamW whose state is sharded over the data-parallel group.
//
// It works on the reduce-scatter gradient buckets (GradBuckets with GradReduce::kReduceScatter
// over a ParamSet laid out by distributed_bucket_layout): every bucket is cut into dp equal
// contiguous shards, and DP rank d owns shard d of every bucket. A shard ignores parameter
// boundaries, so a parameter may be split over several ranks; every element of a shard belongs to
// at most one Param (the rest is padding) and is stepped with that Param's weight decay (none for
// biases and norm weights, Megatron's param groups). For the owned elements only, and only here:
//
//   m, v   the Adam moments, 2 x 4 bytes per owned element in fp32, fewer with the
//          precision-aware optimizer's storage (MomentStorage: bf16, fp16 or fp8 moments,
//          AdamWConfig's exp_avg_dtype / exp_avg_sq_dtype): state_bytes() falls as 1/dp;
//          under --optimizer sgd, m is the momentum buffer (none without momentum) and v empty
//   w      the fp32 main weights: the owned range of ParamSet::main(), stepped in place
//
// Where w and g live is the ParamSet's (ParamSet::main_shard / grad_shard): in fp32 runs the
// main weights are the compute weights and stay whole on every rank (8 + 8/dp bytes per
// parameter, Megatron's figure); in bf16/fp16 runs the ParamSet keeps only the owned shards of
// the fp32 main weights (Sharding::main) and the whole 16-bit compute copy (6 + 12/dp, Megatron's
// figure). Megatron-FSDP's strategies shard the gradients, and the weights, too (docs/FSDP.md).
//
// A step on DP rank d, after GradBuckets::finish() left the mean gradient g in its shards:
//   for every owned element i of Param p:  AdamW(w_i, m_i, v_i, g_i, weight decay of p)
//   fp32:   w = all_gather over DP of every bucket's shards; compute copy = w
//   16-bit: this rank's part of the compute copy = w (rounded); compute copy = all_gather of it;
//           FP8 primary weights (--fp8-param-gather, Param::fp8): this rank's part of their codes
//           = w quantised (quantize_fp8_weights), and the codes are what is all-gathered
//   weights sharded (ZeRO-3): the compute shards = w; nothing gathered (the FSDP runtime gathers
//           each unit when a layer reads it)
// which is, element for element, the step that AdamW (adamw.h) takes on all-reduced gradients.
//
// The gradient norm: grad_sum_squares_unique() sums the squares of the owned gradient elements
// once each, leaving out Params that are duplicates (Param::is_duplicate: TP replicas on TP rank
// > 0, the last stage's tied-embedding copy); the caller sums it over the data-parallel group and
// then the model-parallel group (together: every rank of the model, each element once) and takes
// the square root. Clipping and fp16 unscaling scale the owned shards only.
//
// With overlap_param_gather (--overlap-param-gather) the step only launches the all-gathers; the
// next forward asks wait_for() (ParamGate) before each layer, which completes the gathers of the
// buckets holding that layer's weights and refreshes their compute copy, so the gathers of the
// later layers run while the earlier ones compute. finish_param_gather() completes them all (before
// anything else reads the weights: evaluation, a checkpoint, the parameter norm, the next step).
//
// The elements of ParamSet::grads() outside the owned shards are stale after finish() and are
// never read here. Not here: the gradient reduction (GradBuckets), checkpointing
// (src/train/checkpointing.h saves and loads the owned segments).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/moment_storage.h"
#include "parallel/grad_buckets.h"
#include "parallel/param.h"
#include "parallel/param_gate.h"
#include "parallel/row_scale.h"

namespace megatron {

class DistributedOptimizer final : public ParamGate {
 public:
  // buckets: reduce-scatter buckets (GradReduce::kReduceScatter); they, their ParamSet and their
  // data-parallel group must outlive this object. Moments start at zero.
  DistributedOptimizer(GradBuckets& buckets, const AdamWConfig& cfg);

  // One AdamW update of the owned main weights from the owned (reduced) gradients times
  // grad_scale (the clipping coefficient, clip_coefficient in adamw.h) at `rates`, then the
  // all-gather of the main weights over DP and the compute-copy refresh. Collective over the
  // data-parallel group. Increments the step counter (bias correction). `after_update`: row
  // factors (qk-clip) applied to the updated owned main weights before they are rounded and
  // gathered (parallel/row_scale.h).
  void step(const StepRates& rates, double grad_scale = 1.0,
            const std::vector<RowScale>& after_update = {});
  // The same row factors without an update (a skipped fp16 step): the owned main weights
  // scaled, then every rank's compute copy refreshed from them (refresh_compute). Collective
  // over every bucket's group, whether or not this rank has factors.
  void scale_main_rows(const std::vector<RowScale>& scales);
  // The same with learning rate lr for every parameter and the configured weight decay.
  void step(double lr, double grad_scale = 1.0) {
    step(StepRates{lr, lr, cfg_.weight_decay}, grad_scale);
  }
  // After the main weights changed outside step() (a checkpoint or pretrained weights loaded):
  // every rank's compute copy from them, all-gathered when the main weights are sharded and the
  // compute copy is not. Collective over the data-parallel group.
  void refresh_compute();
  // Sharded main weights: every Param's whole fp32 main weights gathered (what the Hugging Face
  // export reads) until release_main_all(). Collective; no-op when they are whole.
  void gather_main_all();
  void release_main_all();
  // --overlap-param-gather: step() leaves the all-gathers in flight (see the file comment).
  void set_overlap_param_gather(bool on) { overlap_param_gather_ = on; }
  // ParamGate: completes the in-flight gathers of the buckets holding `params`.
  void wait_for(const std::vector<const Param*>& params) const override;
  // Completes every in-flight gather.
  void finish_param_gather() const;
  // Seconds spent waiting for the all-gathers so far: all of their time without overlap, what
  // the forward did not hide with it.
  double param_gather_wait_seconds() const { return gather_wait_seconds_; }

  // This rank's share of the squared global gradient norm (see the file comment), in double.
  double grad_sum_squares_unique(ParamDomain only = ParamDomain::kAll,
                                 NormGroup group = NormGroup::kAll) const;
  // The same for the owned fp32 main weights (the parameter norm when the weights are sharded;
  // frozen parameters left out, as params_sum_squares_unique does).
  double main_sum_squares_unique(ParamDomain only = ParamDomain::kAll) const;
  // The zero elements of the owned gradient shards, duplicates left out (summed over DP by the
  // caller, as the squares are).
  int64_t grad_zeros_unique(ParamDomain only = ParamDomain::kAll) const;
  // Scales the owned gradient shards (fp16 unscaling: factor 1 / loss scale).
  void scale_grads(double factor);
  // True when every owned gradient element is finite (the caller MAX-reduces the verdict over
  // every rank: each element of the model has exactly one owner per model-parallel rank).
  bool grads_finite() const;

  const AdamWConfig& config() const { return cfg_; }
  int64_t steps() const { return step_; }
  // Restores the step counter (bias correction) from a checkpoint.
  void set_steps(int64_t steps) { step_ = steps; }
  // One Param's part of one owned shard: elements [param_begin, param_begin + numel) of the
  // Param's local tensor have their moments at [state, state + numel) of exp_avg() and
  // exp_avg_sq(). What a checkpoint saves and loads.
  struct OwnedSegment {
    const Param* param = nullptr;
    int64_t param_begin = 0, numel = 0, state = 0;
  };
  std::vector<OwnedSegment> owned_segments() const;
  // Elements this rank owns: the sum of its shard lengths, padding included.
  int64_t owned_numel() const { return owned_numel_; }
  // Bytes of optimizer state on this rank (the two moments; SGD's buffer, or nothing): their
  // element sizes x owned_numel().
  int64_t state_bytes() const { return exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }
  // The moments of the owned elements, [owned_numel()]: bucket 0's shard, then bucket 1's, ...
  // in their storage (one group per segment, in owned_segments() order).
  const MomentStorage& exp_avg() const { return exp_avg_; }
  const MomentStorage& exp_avg_sq() const { return exp_avg_sq_; }
  // Both moments as fp32 [owned_numel()] (what a checkpoint saves and loads): the storage itself
  // when it is fp32, else unscaled copies, which set_moments() stores back after a load.
  std::pair<Tensor, Tensor> moments_f32() const;
  void set_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq);
  // Where bucket i's shard starts in exp_avg() / exp_avg_sq(): element shard_range(i).first + k
  // of the flat buffers has its moments at state_offset(i) + k.
  int64_t state_offset(int64_t bucket) const { return state_offsets_[bucket]; }

 private:
  // One Param's part of one owned shard: [begin, begin + numel) in the flat buffers, moments at
  // [state, state + numel).
  struct Segment {
    int64_t begin = 0, numel = 0, state = 0;
    const Param* param = nullptr;
  };

  GradBuckets& buckets_;
  ParamSet& params_;
  AdamWConfig cfg_;
  std::vector<int64_t> state_offsets_;  // per bucket
  int64_t owned_numel_ = 0;
  std::vector<Segment> segments_;  // in buffer order
  MomentStorage exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
  bool overlap_param_gather_ = false;
  // Per bucket, the all-gather in flight (an empty Work when none); mutable: waiting on it is
  // what a const forward does through the gate.
  mutable std::vector<Work> gathers_;
  mutable std::vector<char> pending_;  // per bucket: its gather is not complete yet
  std::vector<std::pair<Tensor, Tensor>> gather_views_;  // per bucket: (whole bucket, own shard)
  mutable double gather_wait_seconds_ = 0;

  // Applies `scales` to the owned segments of their Params; with `rounded`, also re-rounds those
  // segments' part of the compute copy (which the step already wrote).
  void scale_owned_rows(const std::vector<RowScale>& scales, bool rounded);
  void complete_gather(int64_t bucket) const;
  // Launches the all-gathers of the updated weights (waits for them without overlap).
  // rounded: this rank's part of the compute copy was already rounded by the step.
  void start_gathers(bool rounded);
  // --fp8-param-gather: this rank's parts of the FP8 primary weights (Param::fp8) quantised into
  // their codes from the owned fp32 main weights, each weight with one scale
  // (Fp8GemmScaling::primary_weight_scale of its amax, the max over its data-parallel group).
  // Collective over the groups of the FP8 buckets.
  void quantize_fp8_weights();
  std::vector<Tensor> main_held_;  // gather_main_all's buffers
  // A segment's main weights and gradients, wherever the ParamSet keeps them (full buffers, or
  // the compact shards of Megatron-FSDP's sharded strategies).
  Tensor main_of(const Segment& s) const;
  Tensor grad_of(const Segment& s) const;
  // The segment's elements of the compute copy (mixed precision with sharded main weights).
  Tensor compute_of(const Segment& s) const;
};

}  // namespace megatron
