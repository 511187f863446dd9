// Megatron's --dataloader-type cyclic: MegatronPretrainingRandomSampler, as a map from the
// sample stream the trainer reads to dataset indices.
//
// The trainer reads samples by position: with `consumed` samples behind it, data-parallel rank r
// takes positions [consumed + r b, consumed + (r + 1) b) of the next micro-step (b the micro-batch
// size, micro-steps of b x dp positions; the single sampler reads position p as sample p). The
// random sampler keeps that stream and reorders what it reads, epoch after epoch:
//   - an epoch is the dataset less its last incomplete micro-step: active = total - total % (b dp)
//     samples; the micro-step at `consumed` is in epoch consumed / active;
//   - each epoch draws torch.randperm from a generator seeded with the epoch number (not --seed:
//     every split with the same size sees the same orders, as in Megatron);
//   - data sharding (the default; off with --no-data-sharding): rank r owns the contiguous bucket
//     [r B, (r + 1) B), B = (total / (b dp)) b, and walks randperm(B) from (consumed % active) /
//     dp;
//   - without it: randperm((total / b) b) from consumed % active, rank r taking every dp-th entry
//     from r on.
// Training never runs out of samples: the epochs repeat (cyclic_iter). Without data sharding
// Megatron's rank 0 can take one extra micro-batch from an epoch's unused tail when
// (total / b) b - active > (b - 1) dp, after which its ranks read from different epochs; this
// map keeps every rank on the same micro-step (docs/ARCHITECTURE.md, Data).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "data/sample_source.h"

namespace megatron {

// torch.randperm(n, generator=g) after g.manual_seed(seed), on the CPU: below n = (2^32 - 1) / 20
// Fisher-Yates forward over 0..n-1 swapping r[i] with r[i + z], z = draw % (n - i), with the
// generator's 32-bit MT19937 draws (checked against PyTorch); from there on PyTorch 2's unbiased
// inside-out variant over 64-bit draws (restated from its source: the PyTorch at hand, 1.13, has
// only the first loop).
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

class RandomSampler {
 public:
  // total: the dataset's samples; dp_size data-parallel ranks reading micro_batch_size each.
  // Throws InvalidArgument when the dataset holds less than one micro-step.
  RandomSampler(int64_t total, int64_t micro_batch_size, int64_t dp_size, bool data_sharding);

  // The dataset index the sampler reads at stream position `position` (see the file comment).
  // Safe to call from several threads.
  int64_t index(int64_t position) const;
  int64_t epoch_of(int64_t position) const { return (position / mbdp_) * mbdp_ / active_; }

 private:
  // The permutation of `epoch`; the two most recent are kept (the prefetcher reads ahead).
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

  int64_t total_, b_, dp_, mbdp_, active_, perm_size_;
  bool sharding_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> cache_;
};

// A SampleSource reading `inner` in a RandomSampler's order; endless.
class SampledSource : public SampleSource {
 public:
  SampledSource(std::unique_ptr<SampleSource> inner, int64_t micro_batch_size, int64_t dp_size,
                bool data_sharding);

  int64_t size() const override;  // unbounded: the epochs repeat
  int64_t seq_length() const override { return inner_->seq_length(); }
  int64_t sample_width() const override { return inner_->sample_width(); }
  void sample(int64_t index, int64_t* out) const override;
  std::vector<int64_t> document_lengths(int64_t index) const override {
    return inner_->document_lengths(sampler_.index(index));
  }

  const SampleSource& inner() const { return *inner_; }
  const RandomSampler& sampler() const { return sampler_; }

 private:
  std::unique_ptr<SampleSource> inner_;
  RandomSampler sampler_;
};

}  // namespace megatron
