// BatchPrefetcher: builds the training micro-batches ahead of time on a background thread
// (--num-workers > 0), in order, so reading and masking data overlaps the model's compute.
//
// The k-th call to next() returns the micro-batch of samples [first + k * b, first + (k + 1) * b),
// exactly what the synchronous path would build: prefetching never changes the data. An error in
// the background thread is rethrown by next().
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "data/gpt_batch.h"

namespace megatron {

class BatchPrefetcher {
 public:
  // depth: batches prepared ahead (0: build each batch inside next()).
  BatchPrefetcher(const SampleSource& data, const BatchOptions& options, int64_t micro_batch_size,
                  int64_t first_sample, int64_t depth);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  GPTBatch next();

 private:
  void run();

  const SampleSource& data_;
  BatchOptions options_;
  int64_t b_, next_sample_, depth_;
  int64_t produced_sample_;  // next sample the background thread will read
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GPTBatch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  bool exhausted_ = false;  // the source has no further full batch
  std::thread worker_;
};

}  // namespace megatron
