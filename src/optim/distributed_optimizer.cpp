// The distributed optimizer's shard bookkeeping (which Param covers which owned elements), its
// AdamW step on the owned shards, and the all-gather of the main weights.
#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "core/timer.h"
#include "parallel/fp8_scaling.h"
#include "tensor/ops.h"

namespace megatron {

DistributedOptimizer::DistributedOptimizer(GradBuckets& buckets, const AdamWConfig& cfg)
    : buckets_(buckets), params_(buckets.params()), cfg_(cfg) {
  MEGATRON_CHECK(buckets.reduce() == GradReduce::kReduceScatter,
                 "the distributed optimizer needs reduce-scatter gradient buckets "
                 "(GradReduce::kReduceScatter), got all-reduce ones");
  // Params in buffer order, with their ranges.
  std::vector<std::pair<int64_t, const Param*>> order;
  for (const Param* p : params_.params())
    if (p->requires_grad) order.emplace_back(params_.offset_of(*p), p);  // the others: no state
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t owned = 0;
  for (int64_t i = 0; i < buckets.num_buckets(); ++i) {
    const auto [s0, s1] = buckets.shard_range(i);
    state_offsets_.push_back(owned);
    // The Params overlapping [s0, s1): a shard may start or end inside one, or hold none.
    for (const auto& [off, p] : order) {
      const int64_t begin = std::max(off, s0), end = std::min(off + p->shape.numel(), s1);
      if (begin < end) segments_.push_back(Segment{begin, end - begin, owned + begin - s0, p});
    }
    owned += s1 - s0;
  }
  // One scale group per segment: what Transformer Engine's FusedAdam scales as one parameter
  // under Megatron's distributed optimizer (a Param's part of this rank's shard).
  owned_numel_ = owned;
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (const Segment& s : segments_) groups.emplace_back(s.state, s.state + s.numel);
  const DType wide = params_.main().dtype();
  // SGD keeps one buffer (none without momentum): the states it lacks hold no elements.
  MEGATRON_CHECK(
      !cfg.sgd() ||
          (cfg.exp_avg_dtype == MomentDType::kF32 && cfg.exp_avg_sq_dtype == MomentDType::kF32),
      "the precision-aware optimizer's storage is Adam's (--use-precision-aware-optimizer "
      "only supported with adam)");
  auto state = [&](int index, MomentDType dtype) {
    return cfg.states() > index ? MomentStorage(owned, dtype, wide, params_.main().device(), groups)
                                : MomentStorage(0, dtype, wide, params_.main().device(), {});
  };
  exp_avg_ = state(0, cfg.exp_avg_dtype);
  exp_avg_sq_ = state(1, cfg.exp_avg_sq_dtype);
}

std::pair<Tensor, Tensor> DistributedOptimizer::moments_f32() const {
  auto f32 = [](const MomentStorage& m) {
    // fp32 storage: its whole buffer (groups and padding) aliased, written in place by a load.
    return m.dtype() == MomentDType::kF32 ? m.whole() : m.to_f32();
  };
  return {f32(exp_avg_), f32(exp_avg_sq_)};
}

void DistributedOptimizer::set_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  if (exp_avg_.dtype() != MomentDType::kF32) exp_avg_.from_f32(exp_avg);
  if (exp_avg_sq_.dtype() != MomentDType::kF32) exp_avg_sq_.from_f32(exp_avg_sq);
}

void DistributedOptimizer::step(const StepRates& rates, double grad_scale,
                                const std::vector<RowScale>& after_update) {
  finish_param_gather();  // the previous step's weights are all in before this one updates them
  ++step_;
  ops::AdamWSpec spec;
  spec.beta1 = static_cast<float>(cfg_.beta1);
  spec.beta2 = static_cast<float>(cfg_.beta2);
  spec.step = step_;
  spec.grad_scale = grad_scale;
  // Sharded mixed-precision main weights: the step rounds this rank's part of the compute copy as
  // it updates the shards (one pass over memory fewer); FP8 codes are quantised after.
  const bool round = params_.main_sharded() && params_.compute().raw() != params_.main().raw();
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& s = segments_[k];
    const auto group = static_cast<int64_t>(k);
    Tensor w = main_of(s);
    spec.lr = static_cast<float>(rates.lr_of(*s.param));
    spec.eps = static_cast<float>(rates.eps_of(*s.param, cfg_.eps));
    spec.weight_decay = static_cast<float>(rates.decay_of(*s.param));
    spec.grad_scale = rates.grad_scale_of(*s.param, grad_scale);
    Tensor rounded = round && !s.param->fp8 ? compute_of(s) : Tensor();
    Tensor* r = rounded.defined() ? &rounded : nullptr;
    if (cfg_.sgd()) {
      Tensor buf = cfg_.states() >= 1 ? exp_avg_.group(group) : Tensor();
      ops::sgd_step(w, buf, grad_of(s), sgd_spec(cfg_, rates, *s.param, step_, spec.grad_scale), r);
      continue;
    }
    Tensor m, v;
    if (exp_avg_.scaled() || exp_avg_sq_.scaled()) {
      // fp16 / fp8 moments (the precision-aware optimizer): rescaled per segment by the step.
      ops::adamw_step_scaled(w, exp_avg_.for_step(group, m), exp_avg_sq_.for_step(group, v),
                             grad_of(s), spec, r);
    } else {
      m = exp_avg_.group(group);  // fp32, or bf16 read and written by the kernel
      v = exp_avg_sq_.group(group);
      ops::adamw_step(w, m, v, grad_of(s), spec, r);
    }
  }
  scale_owned_rows(after_update, round);
  if (round) params_.sync_frozen_compute();
  if (params_.weights_sharded()) {
    // ZeRO-3: the weights stay sharded; the FSDP runtime gathers each unit when a layer needs it.
    if (!round) params_.sync_compute_from_main();
    quantize_fp8_weights();
    return;
  }
  start_gathers(/*rounded=*/round);
}

void DistributedOptimizer::scale_owned_rows(const std::vector<RowScale>& scales, bool rounded) {
  if (scales.empty()) return;
  std::unordered_map<const Param*, const RowScale*> by_param;
  for (const RowScale& r : scales)
    if (!r.param->frozen) by_param[r.param] = &r;
  for (const Segment& s : segments_) {
    const auto it = by_param.find(s.param);
    if (it == by_param.end()) continue;
    scale_rows_of(main_of(s), *it->second, s.begin - params_.offset_of(*s.param));
    // FP8 primary weights are quantised from the main weights after this.
    if (rounded && !s.param->fp8) compute_of(s).copy_from(main_of(s));
  }
}

void DistributedOptimizer::scale_main_rows(const std::vector<RowScale>& scales) {
  // Collective even when this rank scales nothing: another rank of a bucket's group may (TP ranks
  // hold different heads, and an expert bucket's group spans them).
  finish_param_gather();
  if (!params_.main_sharded()) {  // fp32: every rank holds the whole main weights
    megatron::scale_main_rows(params_, scales);
    return;
  }
  scale_owned_rows(scales, /*rounded=*/false);
  refresh_compute();
}

void DistributedOptimizer::refresh_compute() {
  finish_param_gather();
  if (!params_.main_sharded() || params_.weights_sharded()) {
    params_.sync_compute_from_main();
    quantize_fp8_weights();
    return;
  }
  const bool overlap = overlap_param_gather_;
  overlap_param_gather_ = false;
  start_gathers(/*rounded=*/false);
  overlap_param_gather_ = overlap;
}

void DistributedOptimizer::start_gathers(bool rounded) {
  // Sharded main weights (mixed precision): this rank's parts of the compute copy are rounded
  // from its shards and the 16-bit compute copy is what travels (Megatron's layout); otherwise
  // the fp32 main weights travel and the compute copy is refreshed from them after.
  const bool compute = params_.main_sharded();
  if (compute) {
    if (!rounded) params_.sync_compute_from_main();
    quantize_fp8_weights();
  }
  // Every rank gets every bucket's updated shards. All buckets in flight at once; each shard is
  // a view inside its bucket (the backend stages it, see ProcessGroup::all_gather). FP8 buckets
  // move their one-byte codes.
  const auto n = static_cast<size_t>(buckets_.num_buckets());
  gathers_.resize(n);
  gather_views_.clear();  // the views live as long as their transfers
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<int64_t>(i);
    if (compute) {
      gather_views_.emplace_back(params_.compute_bucket(b), params_.compute_shard(b));
    } else {
      const auto [b0, b1] = buckets_.bucket_range(b);
      const auto [s0, s1] = buckets_.shard_range(b);
      gather_views_.emplace_back(params_.main().flat_view(b0, {b1 - b0}),
                                 params_.main().flat_view(s0, {s1 - s0}));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    // Over the bucket's group: data parallel, or expert data parallel for expert buckets.
    gathers_[i] = buckets_.group_of(static_cast<int64_t>(i))
                      .all_gather_async(gather_views_[i].first, gather_views_[i].second);
  }
  pending_.assign(gathers_.size(), 1);
  if (!overlap_param_gather_) {
    const Timer timer;
    for (Work& w : gathers_) w.wait();
    gather_wait_seconds_ += timer.elapsed();
    if (!compute) params_.sync_compute_from_main();
    pending_.assign(gathers_.size(), 0);
  }
}

void DistributedOptimizer::complete_gather(int64_t bucket) const {
  if (!pending_[static_cast<size_t>(bucket)]) return;
  const Timer timer;
  gathers_[static_cast<size_t>(bucket)].wait();
  pending_[static_cast<size_t>(bucket)] = 0;
  gather_wait_seconds_ += timer.elapsed();
  if (params_.main_sharded()) return;  // the compute copy itself was gathered
  const auto [b0, b1] = buckets_.bucket_range(bucket);
  params_.sync_compute_from_main(b0, b1);
}

void DistributedOptimizer::wait_for(const std::vector<const Param*>& params) const {
  if (gathers_.empty()) return;
  // Open MPI advances nonblocking collectives only inside MPI calls: testing every pending
  // gather at each layer boundary keeps the later buckets moving while this layer computes.
  for (size_t i = 0; i < gathers_.size(); ++i) {
    if (pending_[i]) gathers_[i].is_completed();
  }
  for (const Param* p : params) complete_gather(buckets_.bucket_of(*p));
}

void DistributedOptimizer::finish_param_gather() const {
  for (int64_t i = 0; i < static_cast<int64_t>(gathers_.size()); ++i) complete_gather(i);
}

void DistributedOptimizer::quantize_fp8_weights() {
  if (params_.first_fp8_bucket() >= buckets_.num_buckets()) return;
  // Each FP8 weight's amax over its owned parts, rounded to bf16 first (the compute dtype the
  // weight would have without the flag, as Megatron casts the main weight before quantising),
  // then the max over the weight's data-parallel group: every rank of a group holds the same
  // weights, so each group's list has the same order everywhere.
  std::vector<Tensor> rounded(segments_.size());
  std::unordered_map<const Param*, size_t> slot;
  std::vector<const Param*> weights;
  std::vector<ProcessGroup*> groups;
  for (const Param* p : params_.params()) {
    if (!p->fp8) continue;
    slot[p] = weights.size();
    weights.push_back(p);
    groups.push_back(&buckets_.group_of(params_.bucket_of(*p)));
  }
  // Blockwise weights have an amax per 128 x 128 tile (Fp8GemmScaling::primary_tile_scales):
  // each owned part adds its elements' maxima to the tiles they fall in.
  auto tiles_of = [&](const Segment& s) {
    const int64_t t = Fp8GemmScaling::kWeightTile;
    return ops::Fp8Tiles{s.begin - params_.offset_of(*s.param), s.param->shape[1], t, t};
  };
  auto n_tiles = [](const Param& p) {
    const int64_t t = Fp8GemmScaling::kWeightTile;
    return p.fp8->tiled_primary_weight() ? (p.shape[0] + t - 1) / t * ((p.shape[1] + t - 1) / t)
                                         : int64_t{1};
  };
  std::vector<std::vector<float>> amax(weights.size());
  std::vector<Tensor> tile_amax(weights.size());  // on the buffers' device, tiled weights only
  for (size_t i = 0; i < weights.size(); ++i) {
    amax[i].assign(n_tiles(*weights[i]), 0.0f);
    if (weights[i]->fp8->tiled_primary_weight())
      tile_amax[i] = Tensor::zeros({n_tiles(*weights[i])}, DType::kF32, params_.device());
  }
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& s = segments_[k];
    if (!s.param->fp8) continue;
    rounded[k] = main_of(s).to(DType::kBF16);
    const size_t i = slot.at(s.param);
    if (tile_amax[i].defined())
      ops::fp8_tile_abs_max(tile_amax[i], rounded[k], tiles_of(s));  // max into the tiles
    else
      amax[i][0] = std::max(amax[i][0], static_cast<float>(ops::abs_max(rounded[k])));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!tile_amax[i].defined()) continue;
    const Tensor host = tile_amax[i].to(Device::kCPU);
    std::copy(host.data<float>(), host.data<float>() + host.numel(), amax[i].begin());
  }
  std::vector<ProcessGroup*> distinct;
  for (ProcessGroup* g : groups)
    if (std::find(distinct.begin(), distinct.end(), g) == distinct.end()) distinct.push_back(g);
  for (ProcessGroup* g : distinct) {
    if (g->size() == 1) continue;
    std::vector<size_t> members;
    int64_t total = 0;
    for (size_t i = 0; i < weights.size(); ++i)
      if (groups[i] == g) {
        members.push_back(i);
        total += static_cast<int64_t>(amax[i].size());
      }
    Tensor t = Tensor::empty({total}, DType::kF32);
    float* p = t.data<float>();
    for (size_t i : members) p = std::copy(amax[i].begin(), amax[i].end(), p);
    g->all_reduce(t, ReduceOp::kMax);
    const float* q = t.data<float>();
    for (size_t i : members) {
      std::copy(q, q + amax[i].size(), amax[i].begin());
      q += amax[i].size();
    }
  }
  std::vector<float> scale(weights.size());
  std::vector<Tensor> tile_scales(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    Fp8GemmScaling& f8 = *weights[i]->fp8;
    if (f8.tiled_primary_weight())
      // The buffers' device (a ZeRO-3 weight's value is unset between uses).
      tile_scales[i] = f8.primary_tile_scales(amax[i], params_.device());
    else
      scale[i] = f8.primary_weight_scale(amax[i][0]);
  }
  // The owned parts' codes, with the scales every rank of the group shares.
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& s = segments_[k];
    if (!s.param->fp8) continue;
    const int64_t b = params_.bucket_of(*s.param);
    Tensor codes =
        params_.compute_shard(b).flat_view(s.begin - params_.owned_range(b).first, {s.numel});
    const size_t i = slot.at(s.param);
    if (tile_scales[i].defined())
      ops::fp8_tile_encode(codes, rounded[k], tiles_of(s), tile_scales[i], Fp8Format::kE4M3);
    else
      ops::fp8_encode(codes, rounded[k], scale[i], Fp8Format::kE4M3);
  }
}

double DistributedOptimizer::grad_sum_squares_unique(ParamDomain only, NormGroup group) const {
  double sum = 0;
  for (const Segment& s : segments_) {
    if (!s.param->is_duplicate() && in_domain(*s.param, only) && in_norm_group(*s.param, group))
      sum += ops::sum_squares(grad_of(s));
  }
  return sum;
}

double DistributedOptimizer::main_sum_squares_unique(ParamDomain only) const {
  double sum = 0;
  for (const Segment& s : segments_) {
    if (!s.param->is_duplicate() && !s.param->frozen && in_domain(*s.param, only))
      sum += ops::sum_squares(main_of(s));
  }
  return sum;
}

Tensor DistributedOptimizer::main_of(const Segment& s) const {
  return params_.main_sharded() ? params_.main().flat_view(s.state, {s.numel})
                                : params_.main().flat_view(s.begin, {s.numel});
}

Tensor DistributedOptimizer::compute_of(const Segment& s) const {
  // The compute copy is compact exactly when the weights are sharded (ZeRO-3), laid out as the
  // main shards are; otherwise it is whole, as the unsharded buffers.
  return params_.compute().flat_view(params_.weights_sharded() ? s.state : s.begin, {s.numel});
}

Tensor DistributedOptimizer::grad_of(const Segment& s) const {
  // The compact shards are laid out as the moments are (bucket shards in order).
  return params_.grads_sharded() ? params_.grads().flat_view(s.state, {s.numel})
                                 : params_.grads().flat_view(s.begin, {s.numel});
}

int64_t DistributedOptimizer::grad_zeros_unique(ParamDomain only) const {
  int64_t zeros = 0;
  for (const Segment& s : segments_) {
    if (!s.param->is_duplicate() && in_domain(*s.param, only))
      zeros += ops::count_zeros(grad_of(s));
  }
  return zeros;
}

void DistributedOptimizer::scale_grads(double factor) {
  for (int64_t i = 0; i < buckets_.num_buckets(); ++i) {
    Tensor shard = params_.grad_shard(i);
    ops::scale_inplace(shard, factor);
  }
}

bool DistributedOptimizer::grads_finite() const {
  double sum = 0;
  for (int64_t i = 0; i < buckets_.num_buckets(); ++i)
    sum += ops::sum_squares(params_.grad_shard(i));
  return std::isfinite(sum);
}

}  // namespace megatron

namespace megatron {

std::vector<DistributedOptimizer::OwnedSegment> DistributedOptimizer::owned_segments() const {
  std::vector<OwnedSegment> out;
  for (const Segment& s : segments_) {
    out.push_back({s.param, s.begin - params_.offset_of(*s.param), s.numel, s.state});
  }
  return out;
}

}  // namespace megatron

namespace megatron {

void DistributedOptimizer::gather_main_all() {
  finish_param_gather();
  main_held_.clear();
  if (!params_.main_sharded()) return;
  for (int64_t b = 0; b < buckets_.num_buckets(); ++b) {
    const auto [b0, b1] = buckets_.bucket_range(b);
    Tensor shard = params_.main_shard(b);
    Tensor full = Tensor::empty({b1 - b0}, shard.dtype(), shard.device());
    buckets_.group_of(b).all_gather(full, shard);
    params_.attach_main(b, full);
    main_held_.push_back(std::move(full));
  }
}

void DistributedOptimizer::release_main_all() {
  if (main_held_.empty()) return;
  for (int64_t b = 0; b < buckets_.num_buckets(); ++b) params_.detach_main(b);
  main_held_.clear();
}

}  // namespace megatron
