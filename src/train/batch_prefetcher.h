// BatchPrefetcher: builds the training micro-batches ahead of time on a background thread
// (--num-workers > 0), in order, so reading and masking data overlaps the model's compute.
//
// Sampling is Megatron's MegatronPretrainingSampler: from `consumed` samples on, each group of
// b x dp_size consecutive sample ids is one micro-step, and data-parallel rank r takes ids
// [r b, (r + 1) b) of it. So the k-th call to next() returns samples
// [consumed + (k dp_size + r) b, consumed + (k dp_size + r + 1) b), exactly what the synchronous
// path builds (prefetching never changes the data), and a run resumed from `consumed` continues
// with the same samples. An error in the background thread is rethrown by next().
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "models/model_spec.h"  // BatchFn

namespace megatron {

class BatchPrefetcher {
 public:
  // depth: batches prepared ahead (0: build each batch inside next()).
  // make: the model's batch maker (ModelSpec::batch_maker).
  BatchPrefetcher(const SampleSource& data, BatchFn make, int64_t micro_batch_size,
                  int64_t consumed_samples, int64_t depth, int64_t dp_rank = 0,
                  int64_t dp_size = 1);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  TensorMap next();

 private:
  void run();

  const SampleSource& data_;
  BatchFn make_;
  int64_t b_, stride_, next_sample_, depth_;
  int64_t produced_sample_;  // next sample the background thread will read
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TensorMap> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  bool exhausted_ = false;  // the source has no further full batch
  std::thread worker_;
};

}  // namespace megatron
