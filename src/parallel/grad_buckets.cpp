// Bucketed, optionally overlapped, data-parallel gradient averaging.
#include "parallel/grad_buckets.h"

#include <algorithm>
#include <numeric>

#include "tensor/ops.h"

namespace megatron {

int64_t default_ddp_bucket_size(int dp_size) {
  return std::max<int64_t>(40000000, 1000000 * static_cast<int64_t>(dp_size));
}

GradBuckets::GradBuckets(ParamSet& params, ProcessGroup& dp, int64_t bucket_size, bool overlap)
    : params_(params), dp_(dp), overlap_(overlap) {
  // Parameters in buffer order (ascending offset).
  std::vector<const Param*> order(params.params().begin(), params.params().end());
  std::vector<int64_t> offset(order.size());
  for (size_t i = 0; i < order.size(); ++i) offset[i] = params.offset_of(*order[i]);
  std::vector<size_t> idx(order.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return offset[a] < offset[b]; });
  const int64_t total = params.grads().numel();
  Bucket cur;
  for (size_t k = 0; k < idx.size(); ++k) {
    bucket_of_[order[idx[k]]] = static_cast<int>(buckets_.size());
    ++cur.num_params;
    // A parameter's share of the buffer runs to the next one's offset (alignment padding
    // included), so the buckets tile the whole buffer.
    cur.end = k + 1 < idx.size() ? offset[idx[k + 1]] : total;
    if ((bucket_size > 0 && cur.end - cur.begin >= bucket_size) || k + 1 == idx.size()) {
      const int64_t next = cur.end;
      buckets_.push_back(std::move(cur));
      cur = Bucket{};
      cur.begin = next;
    }
  }
  for (Bucket& b : buckets_) b.view = params.grads().flat_view(b.begin, Shape{b.end - b.begin});
}

void GradBuckets::reset() {
  for (Bucket& b : buckets_) {
    b.work.wait();
    b.ready = 0;
    b.launched = false;
  }
  for (auto& [p, r] : ready_) r = false;
}

void GradBuckets::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  if (dp_.size() == 1) return;
  ops::scale_inplace(b.view, 1.0 / static_cast<double>(dp_.size()));
  b.work = dp_.all_reduce_async(b.view);
}

void GradBuckets::mark_ready(const Param& p) {
  if (!overlap_) return;
  auto it = bucket_of_.find(&p);
  MEGATRON_ASSERT(it != bucket_of_.end(), "parameter ", p.name, " is in no gradient bucket");
  bool& marked = ready_[&p];
  MEGATRON_ASSERT(!marked, "parameter ", p.name, " marked ready twice in a step");
  marked = true;
  Bucket& b = buckets_[it->second];
  if (++b.ready == b.num_params) launch(b);
}

void GradBuckets::poll() {
  for (Bucket& b : buckets_) {
    if (b.launched) b.work.is_completed();
  }
}

void GradBuckets::finish() {
  for (Bucket& b : buckets_) launch(b);
  for (Bucket& b : buckets_) b.work.wait();
}

}  // namespace megatron
