// One producer thread builds micro-batches in sampler order into a bounded queue; next() pops
// them in the same order, so prefetching never changes the data.
#include "train/batch_prefetcher.h"

#include "core/error.h"

namespace megatron {

BatchPrefetcher::BatchPrefetcher(const SampleSource& data, BatchFn make, int64_t micro_batch_size,
                                 int64_t consumed_samples, int64_t depth, int64_t dp_rank,
                                 int64_t dp_size)
    : data_(data),
      make_(std::move(make)),
      b_(micro_batch_size),
      stride_(micro_batch_size * dp_size),
      next_sample_(consumed_samples + dp_rank * micro_batch_size),
      depth_(depth),
      produced_sample_(next_sample_) {
  MEGATRON_ASSERT(dp_rank >= 0 && dp_rank < dp_size, "data-parallel rank out of range");
  if (depth_ > 0) worker_ = std::thread([this] { run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchPrefetcher::run() {
  for (;;) {
    int64_t first;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || static_cast<int64_t>(ready_.size()) < depth_; });
      if (stop_) return;
      first = produced_sample_;
    }
    // The last batches of a finite source are never requested; stop rather than fail on them.
    if (first + b_ > data_.size()) {
      std::lock_guard<std::mutex> lock(mu_);
      exhausted_ = true;
      cv_.notify_all();
      return;
    }
    try {
      TensorMap batch = make_(data_, first, b_);
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(batch));
      produced_sample_ = first + stride_;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
  }
}

TensorMap BatchPrefetcher::next() {
  if (depth_ == 0) {
    TensorMap batch = make_(data_, next_sample_, b_);
    next_sample_ += stride_;
    return batch;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !ready_.empty() || error_ || exhausted_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  MEGATRON_CHECK(!ready_.empty(), "the dataset has ", data_.size(),
                 " samples; a batch starting at sample ", next_sample_, " was requested");
  TensorMap batch = std::move(ready_.front());
  ready_.pop_front();
  next_sample_ += stride_;
  cv_.notify_all();
  return batch;
}

}  // namespace megatron
