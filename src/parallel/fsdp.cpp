// Megatron-FSDP's lending of gathered weights and gradient buffers around each unit's use.
#include "parallel/fsdp.h"

#include <algorithm>
#include <string>

#include "core/timer.h"

namespace megatron {

FsdpRuntime::FsdpRuntime(GradBuckets& buckets, const ParamGate* inner)
    : buckets_(buckets), params_(buckets.params()), inner_(inner) {
  MEGATRON_CHECK(buckets.grads_sharded(),
                 "FsdpRuntime needs gradient buckets whose ParamSet is sharded "
                 "(a ParamSet built with Sharding::grads)");
  units_.resize(static_cast<size_t>(buckets.num_buckets()));
  std::vector<std::string> names;
  for (int64_t b = 0; b < buckets.num_buckets(); ++b) {
    units_[static_cast<size_t>(b)].reported.assign(params_.bucket_params(b).size(), 0);
    const std::vector<Param*>& ps = params_.bucket_params(b);
    const std::string name = ps.empty() ? std::string() : fsdp_unit(ps.front()->name);
    const auto it = std::find(names.begin(), names.end(), name);
    const auto u = static_cast<int64_t>(it - names.begin());
    if (it == names.end()) {
      names.push_back(name);
      unit_buckets_.emplace_back();
    }
    unit_of_.push_back(u);
    unit_buckets_[static_cast<size_t>(u)].push_back(b);
  }
}

FsdpRuntime::~FsdpRuntime() {
  // Nothing may still write into a buffer this object owns.
  for (Unit& u : units_) {
    if (u.gathering) u.gather.wait();
  }
}

std::vector<int64_t> FsdpRuntime::buckets_of(const std::vector<const Param*>& params) const {
  std::vector<int64_t> out;
  for (const Param* p : params) {
    const int64_t b = params_.bucket_of(*p);
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  return out;
}

void FsdpRuntime::account(int64_t delta) const {
  lent_ += delta;
  peak_lent_ = std::max(peak_lent_, lent_);
}

void FsdpRuntime::start_gather(int64_t b) const {
  Unit& u = units_[static_cast<size_t>(b)];
  const auto [begin, end] = params_.bucket_ranges()[static_cast<size_t>(b)];
  Tensor shard = params_.compute_shard(b);
  u.weights = Tensor::empty({end - begin}, shard.dtype(), shard.device());
  u.gather = buckets_.group_of(b).all_gather_async(u.weights, shard);
  u.gathering = true;
  ++gathers_;
  account(static_cast<int64_t>(u.weights.nbytes()));
}

void FsdpRuntime::ensure_weights(int64_t b) const {
  if (!shards_weights()) return;
  Unit& u = units_[static_cast<size_t>(b)];
  if (prefetched_ == unit_of_[static_cast<size_t>(b)]) prefetched_ = -1;  // used now
  if (!u.weights.defined()) start_gather(b);
  if (u.gathering) {
    const Timer timer;
    u.gather.wait();
    gather_wait_ += timer.elapsed();
    u.gathering = false;
    params_.attach_weights(b, u.weights);
  }
}

void FsdpRuntime::maybe_drop(int64_t b) const {
  if (!shards_weights()) return;
  Unit& u = units_[static_cast<size_t>(b)];
  if (u.forward_refs > 0 || u.in_backward || !u.weights.defined() ||
      prefetched_ == unit_of_[static_cast<size_t>(b)])
    return;
  if (u.gathering) {
    u.gather.wait();
    u.gathering = false;
  }
  params_.detach_weights(b);
  account(-static_cast<int64_t>(u.weights.nbytes()));
  u.weights = Tensor();
}

std::pair<int64_t, int64_t> FsdpRuntime::unit_range(const std::vector<int64_t>& buckets) const {
  int64_t lo = INT64_MAX, hi = -1;
  for (int64_t b : buckets) {
    lo = std::min(lo, unit_of_[static_cast<size_t>(b)]);
    hi = std::max(hi, unit_of_[static_cast<size_t>(b)]);
  }
  return {lo, hi};
}

void FsdpRuntime::prefetch(int64_t u) const {
  if (!shards_weights() || u < 0 || u >= static_cast<int64_t>(unit_buckets_.size())) return;
  const std::vector<int64_t>& bs = unit_buckets_[static_cast<size_t>(u)];
  bool held = true;
  for (int64_t b : bs) held = held && units_[static_cast<size_t>(b)].weights.defined();
  if (held) return;
  // At most one unit gathered ahead: a guess that was not used is dropped.
  if (prefetched_ >= 0) {
    const int64_t old = prefetched_;
    prefetched_ = -1;
    for (int64_t b : unit_buckets_[static_cast<size_t>(old)]) maybe_drop(b);
  }
  for (int64_t b : bs) {
    if (!units_[static_cast<size_t>(b)].weights.defined()) start_gather(b);
  }
  prefetched_ = u;
}

void FsdpRuntime::wait_for(const std::vector<const Param*>& params) const {
  if (inner_) inner_->wait_for(params);
  const std::vector<int64_t> bs = buckets_of(params);
  for (int64_t b : bs) {
    ++units_[static_cast<size_t>(b)].forward_refs;
    ensure_weights(b);
  }
  // Forward runs the units in decreasing buffer order (layers are laid out in reverse).
  if (!bs.empty()) prefetch(unit_range(bs).first - 1);
}

void FsdpRuntime::release(const std::vector<const Param*>& params) const {
  for (int64_t b : buckets_of(params)) {
    Unit& u = units_[static_cast<size_t>(b)];
    MEGATRON_ASSERT(u.forward_refs > 0, "FSDP: release of unit ", b, " that no forward holds");
    --u.forward_refs;
    maybe_drop(b);
  }
}

void FsdpRuntime::before_backward(const std::vector<const Param*>& params) {
  const std::vector<int64_t> bs = buckets_of(params);
  for (int64_t b : bs) {
    Unit& u = units_[static_cast<size_t>(b)];
    if (u.in_backward) continue;  // a second module of the same unit (tied embeddings)
    ensure_weights(b);
    u.in_backward = true;
    const auto [begin, end] = params_.bucket_ranges()[static_cast<size_t>(b)];
    u.grads = Tensor::zeros({end - begin}, params_.grads().dtype(), params_.grads().device());
    account(static_cast<int64_t>(u.grads.nbytes()));
    params_.attach_grads(b, u.grads);
    std::fill(u.reported.begin(), u.reported.end(), 0);
    u.num_reported = 0;
  }
  // Backward runs the units in increasing buffer order.
  if (!bs.empty()) prefetch(unit_range(bs).second + 1);
}

void FsdpRuntime::after_backward(const std::vector<const Param*>& params) {
  for (const Param* p : params) {
    const int64_t b = params_.bucket_of(*p);
    Unit& u = units_[static_cast<size_t>(b)];
    if (!u.in_backward) continue;
    const std::vector<Param*>& ps = params_.bucket_params(b);
    const auto it = std::find(ps.begin(), ps.end(), p);
    const auto k = static_cast<size_t>(it - ps.begin());
    if (u.reported[k]) continue;
    u.reported[k] = 1;
    if (++u.num_reported == static_cast<int64_t>(ps.size())) close_backward(b);
  }
}

void FsdpRuntime::close_backward(int64_t b) {
  Unit& u = units_[static_cast<size_t>(b)];
  u.in_backward = false;
  params_.detach_grads(b);
  account(-static_cast<int64_t>(u.grads.nbytes()));
  Tensor g = std::move(u.grads);
  u.grads = Tensor();
  buckets_.reduce_scatter_add(b, std::move(g));
  maybe_drop(b);
}

void FsdpRuntime::finish() {
  for (int64_t b = 0; b < static_cast<int64_t>(units_.size()); ++b) {
    if (units_[static_cast<size_t>(b)].in_backward) close_backward(b);
  }
  buckets_.finish();
  prefetched_ = -1;
  for (int64_t b = 0; b < static_cast<int64_t>(units_.size()); ++b) {
    units_[static_cast<size_t>(b)].forward_refs = 0;
    maybe_drop(b);
  }
}

}  // namespace megatron
