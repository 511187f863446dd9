// Bucketed, optionally overlapped, data-parallel gradient averaging.
#include "parallel/grad_buckets.h"

#include <algorithm>
#include <numeric>

#include "tensor/ops.h"

namespace megatron {

int64_t default_ddp_bucket_size(int dp_size) {
  return std::max<int64_t>(40000000, 1000000 * static_cast<int64_t>(dp_size));
}

BucketLayout distributed_bucket_layout(int64_t bucket_size, int dp_size, int expert_dp_size) {
  MEGATRON_CHECK(dp_size >= 1 && expert_dp_size >= 1, "data-parallel sizes must be >= 1, got ",
                 dp_size, " and ", expert_dp_size);
  return BucketLayout{
      bucket_size,
      std::lcm(std::lcm(int64_t{16} * dp_size, int64_t{16} * expert_dp_size), int64_t{128})};
}

GradBuckets::GradBuckets(ParamSet& params, ProcessGroup& dp, int64_t bucket_size, bool overlap,
                         GradReduce reduce, ExpertReduction expert, ProcessGroup* inter)
    : params_(params), dp_(dp), overlap_(overlap), reduce_(reduce) {
  MEGATRON_CHECK(inter == nullptr || (reduce == GradReduce::kReduceScatter &&
                                      (expert.group == nullptr || expert.inter != nullptr)),
                 "several distributed-optimizer instances need the distributed optimizer and, "
                 "for experts split apart, their own instances");
  // Parameters in buffer order (ascending offset).
  // (Frozen weights without gradients lie after every bucket and take part in none.)
  std::vector<const Param*> order;
  for (const Param* p : params.params())
    if (p->requires_grad) order.push_back(p);
  std::vector<int64_t> offset(order.size());
  for (size_t i = 0; i < order.size(); ++i) offset[i] = params.offset_of(*order[i]);
  std::vector<size_t> idx(order.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return offset[a] < offset[b]; });
  const int64_t total = params.grads().numel();
  if (reduce == GradReduce::kReduceScatter) {
    // The ParamSet laid the buckets out (and padded them); take them as they are.
    MEGATRON_CHECK(params.bucketed(),
                   "reduce-scatter gradient buckets need a ParamSet laid out in padded buckets; "
                   "construct it with distributed_bucket_layout(bucket_size, dp size)");
    const BucketLayout& layout = params.bucket_layout();
    MEGATRON_CHECK(
        layout.bucket_size == bucket_size || (layout.bucket_size <= 0 && bucket_size <= 0),
        "the ParamSet was laid out for buckets of ", layout.bucket_size,
        " elements, the gradient buckets were given ", bucket_size,
        "; pass the same bucket size to both");
    const int group_size = expert.group ? expert.group->size() : 1;
    MEGATRON_CHECK(layout.pad_multiple % dp.size() == 0 && layout.pad_multiple % group_size == 0,
                   "the ParamSet's buckets are padded to a multiple of ", layout.pad_multiple,
                   " elements, which the data-parallel size ", dp.size(),
                   " (or the expert-data-parallel size ", group_size,
                   ") does not divide; lay it out with distributed_bucket_layout(", bucket_size,
                   ", ", dp.size(), ", ", group_size, ")");
    for (const auto& [begin, end] : params.bucket_ranges()) {
      Bucket b;
      b.begin = begin;
      b.end = end;
      buckets_.push_back(std::move(b));
    }
    size_t bucket = 0;
    for (size_t k : idx) {
      while (bucket < buckets_.size() && offset[k] >= buckets_[bucket].end) ++bucket;
      MEGATRON_ASSERT(bucket < buckets_.size(), order[k]->name, " lies outside every bucket");
      bucket_of_[order[k]] = static_cast<int>(bucket);
      ++buckets_[bucket].num_params;
    }
  } else {
    Bucket cur;
    for (size_t k = 0; k < idx.size(); ++k) {
      bucket_of_[order[idx[k]]] = static_cast<int>(buckets_.size());
      ++cur.num_params;
      // A parameter's share of the buffer runs to the next one's offset (alignment padding
      // included), so the buckets tile the whole buffer.
      cur.end = k + 1 < idx.size() ? offset[idx[k + 1]] : total;
      const bool domain_ends = k + 1 < idx.size() &&
                               order[idx[k]]->expert_parallel != order[idx[k + 1]]->expert_parallel;
      if ((bucket_size > 0 && cur.end - cur.begin >= bucket_size) || domain_ends ||
          k + 1 == idx.size()) {
        const int64_t next = cur.end;
        buckets_.push_back(std::move(cur));
        cur = Bucket{};
        cur.begin = next;
      }
    }
  }
  // Each bucket's group: an expert bucket (all its parameters expert-parallel; the layouts never
  // mix the two) reduces over the expert group when one is given.
  std::vector<bool> expert_bucket(buckets_.size(), true);
  for (const auto& [p, i] : bucket_of_)
    if (!p->expert_parallel) expert_bucket[static_cast<size_t>(i)] = false;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const bool ex = expert.group && expert_bucket[i] && b.num_params > 0;
    b.group = ex ? expert.group : &dp;
    b.inter = ex ? expert.inter : inter;
    const int instances = b.inter ? b.inter->size() : 1;
    b.scale = ex ? expert.scale : 1.0 / (static_cast<double>(dp.size()) * instances);
  }
  for (Bucket& b : buckets_) {
    b.shard_begin = b.begin;
    b.shard_end = b.end;
    if (reduce == GradReduce::kReduceScatter) {
      ProcessGroup& g = *b.group;
      const int64_t n = (b.end - b.begin) / g.size();
      MEGATRON_ASSERT(n * g.size() == b.end - b.begin, "bucket [", b.begin, ", ", b.end,
                      ") does not split into ", g.size(), " shards");
      b.shard_begin = b.begin + g.rank() * n;
      b.shard_end = b.shard_begin + n;
    }
    if (params.grads_sharded()) {
      // Megatron-FSDP: the ParamSet keeps only the shards, cut as these are.
      const int64_t i = &b - buckets_.data();
      MEGATRON_CHECK(params.owned_range(i) == std::make_pair(b.shard_begin, b.shard_end),
                     "the ParamSet's shard of bucket ", i, " is not this rank's shard over the ",
                     "bucket's group: shard it over the same groups");
      b.shard = params.grad_shard(i);
      continue;
    }
    b.view = params.grads().flat_view(b.begin, Shape{b.end - b.begin});
    b.shard = params.grads().flat_view(b.shard_begin, Shape{b.shard_end - b.shard_begin});
  }
}

namespace {

// The group's copies of this rank's shard, [n x shard] in any dtype, added in f32 in rank order.
Tensor sum_copies(const Tensor& gathered, int n) {
  const Tensor g = gathered.dtype() == DType::kF32 ? gathered : gathered.to(DType::kF32);
  const int64_t m = g.numel() / n;
  Tensor sum = g.flat_view(0, Shape{m}).clone();
  for (int j = 1; j < n; ++j) ops::add_inplace(sum, g.flat_view(j * m, Shape{m}));
  return sum;
}

}  // namespace

void GradBuckets::complete_accumulation(Bucket& b) {
  b.work.wait();
  const Tensor sum = sum_copies(b.gathered, b.group->size());
  b.shard.copy_from(reduce_in_bf16_ ? sum.to(DType::kBF16) : sum);
  b.gathered = b.low = Tensor();
  if (accumulating_ == &b) accumulating_ = nullptr;
}

void GradBuckets::reduce_scatter_add(int64_t i, Tensor full) {
  Bucket& b = buckets_[static_cast<size_t>(i)];
  MEGATRON_ASSERT(full.numel() == b.end - b.begin, "reduce_scatter_add: bucket ", i, " has ",
                  b.end - b.begin, " elements, got ", full.str());
  if (before_reduce_) before_reduce_(i, full);
  if (!reduce_enabled_) return;
  ProcessGroup& g = *b.group;
  if (average_ && b.scale != 1.0) ops::scale_inplace(full, b.scale);
  if (g.size() == 1) {
    ops::add_inplace(b.shard, full);
    return;
  }
  Pending p;
  p.bucket = i;
  p.full = std::move(full);
  if (reduce_in_bf16_) {
    p.low = p.full.to(DType::kBF16);
    p.out = Tensor::empty(b.shard.shape(), DType::kBF16, b.shard.device());
    p.work = g.reduce_scatter_async(p.out, p.low);
  } else {
    p.out = Tensor::empty(b.shard.shape(), DType::kF32, b.shard.device());
    p.work = g.reduce_scatter_async(p.out, p.full);
  }
  pending_.push_back(std::move(p));
  while (pending_.size() > 2) complete_oldest();
}

void GradBuckets::complete_oldest() {
  Pending& p = pending_.front();
  p.work.wait();
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  // Added in launch order, so the sum over micro-batches is the same on every run.
  ops::add_inplace(b.shard, p.out.dtype() == DType::kF32 ? p.out : p.out.to(DType::kF32));
  pending_.erase(pending_.begin());
}

void GradBuckets::reset() {
  while (!pending_.empty()) complete_oldest();
  for (Bucket& b : buckets_) {
    b.work.wait();
    b.ready = 0;
    b.launched = false;
    b.gathered = b.low = b.low_shard = Tensor();
  }
  accumulating_ = nullptr;
  for (auto& [p, r] : ready_) r = false;
}

void GradBuckets::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  if (before_reduce_) before_reduce_(&b - buckets_.data(), b.view);
  if (!reduce_enabled_) return;
  ProcessGroup& g = *b.group;
  // An expert bucket's scale is not 1 / |group| (ExpertReduction): applied even alone.
  if (average_ && b.scale != 1.0) ops::scale_inplace(b.view, b.scale);
  if (g.size() == 1) return;
  if (fp32_accumulation_ && reduce_ == GradReduce::kReduceScatter) {
    // One bucket's copies at a time: the previous one's sum first (its gradients are final).
    if (accumulating_ != nullptr) complete_accumulation(*accumulating_);
    // Each rank receives every rank's copy of its shard (the all-to-all's chunk r is shard r).
    if (reduce_in_bf16_) b.low = b.view.to(DType::kBF16);
    const Tensor& send = reduce_in_bf16_ ? b.low : b.view;
    b.gathered = Tensor::empty(send.shape(), send.dtype(), send.device());
    b.work = g.all_to_all_async(b.gathered, send);
    accumulating_ = &b;
    return;
  }
  if (reduce_in_bf16_) {
    b.low = b.view.to(DType::kBF16);
    if (reduce_ == GradReduce::kReduceScatter) {
      b.low_shard = Tensor::empty(b.shard.shape(), DType::kBF16, b.shard.device());
      b.work = g.reduce_scatter_async(b.low_shard, b.low);
    } else {
      b.work = g.all_reduce_async(b.low);
    }
  } else if (reduce_ == GradReduce::kReduceScatter) {
    b.work = g.reduce_scatter_async(b.shard, b.view);
  } else {
    b.work = g.all_reduce_async(b.view);
  }
}

int GradBuckets::bucket_of(const Param& p) const {
  auto it = bucket_of_.find(&p);
  MEGATRON_ASSERT(it != bucket_of_.end(), "parameter ", p.name, " is in no gradient bucket");
  return it->second;
}

void GradBuckets::mark_ready(const Param& p) {
  if (!overlap_ || grads_sharded() || !p.requires_grad) return;
  auto it = bucket_of_.find(&p);
  MEGATRON_ASSERT(it != bucket_of_.end(), "parameter ", p.name, " is in no gradient bucket");
  bool& marked = ready_[&p];
  MEGATRON_ASSERT(!marked, "parameter ", p.name, " marked ready twice in a step");
  marked = true;
  Bucket& b = buckets_[it->second];
  if (++b.ready == b.num_params) launch(b);
}

void GradBuckets::poll() {
  for (Pending& p : pending_) p.work.is_completed();
  for (Bucket& b : buckets_) {
    if (b.launched) b.work.is_completed();
  }
}

void GradBuckets::finish() {
  if (grads_sharded()) {
    while (!pending_.empty()) complete_oldest();
    sum_over_instances();
    return;
  }
  for (Bucket& b : buckets_) launch(b);
  for (Bucket& b : buckets_) {
    if (b.gathered.defined()) {
      complete_accumulation(b);
      continue;
    }
    b.work.wait();
    if (b.low.defined()) {  // widen the bf16 result back into the fp32 buffer
      if (reduce_ == GradReduce::kReduceScatter) {
        b.shard.copy_from(b.low_shard);
      } else {
        b.view.copy_from(b.low);
      }
      b.low = b.low_shard = Tensor();
    }
  }
  sum_over_instances();
}

void GradBuckets::sum_over_instances() {
  // Several optimizer instances (Megatron-FSDP's hybrid sharding too): each shard summed over the
  // instances (launched for every bucket, then waited for, so they travel together).
  // With --grad-reduce-in-bf16 the sum travels in bf16 as well (Megatron's bf16 buffer).
  if (!reduce_enabled_) return;
  std::vector<Work> inter;
  std::vector<std::pair<Tensor*, Tensor>> low;  // shard, its bf16 copy in flight
  low.reserve(buckets_.size());
  for (Bucket& b : buckets_) {
    if (!b.inter || b.inter->size() == 1) continue;
    if (reduce_in_bf16_) {
      low.emplace_back(&b.shard, b.shard.to(DType::kBF16));
      inter.push_back(b.inter->all_reduce_async(low.back().second));
    } else {
      inter.push_back(b.inter->all_reduce_async(b.shard));
    }
  }
  for (Work& w : inter) w.wait();
  for (auto& [shard, l] : low) shard->copy_from(l);
}

}  // namespace megatron
