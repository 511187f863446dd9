// The random (cyclic) sampler's permutations and its position -> index map.
#include "data/random_sampler.h"

#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"

namespace megatron {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  MEGATRON_ASSERT(n >= 0, "randperm of a negative size");
  std::vector<int64_t> r(static_cast<size_t>(n));
  // PyTorch's CPU generator seeds MT19937 with the seed's low 32 bits (init_genrand), which is
  // what std::mt19937's integer constructor does.
  std::mt19937 mt(static_cast<uint32_t>(seed & 0xffffffffu));
  if (n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20)) {
    std::iota(r.begin(), r.end(), int64_t{0});
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t z = static_cast<int64_t>(mt() % static_cast<uint32_t>(n - i));
      std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + z)]);
    }
    return r;
  }
  // Large n (PyTorch 2's randperm_cpu; 1.13 has only the loop above): the inside-out shuffle over
  // 64-bit draws, two 32-bit ones with the first in the high half (CPUGeneratorImpl::random64).
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hi = mt(), lo = mt();
    const auto z = static_cast<size_t>(((hi << 32) | lo) % static_cast<uint64_t>(i + 1));
    r[static_cast<size_t>(i)] = r[z];
    r[z] = i;
  }
  return r;
}

RandomSampler::RandomSampler(int64_t total, int64_t micro_batch_size, int64_t dp_size,
                             bool data_sharding)
    : total_(total),
      b_(micro_batch_size),
      dp_(dp_size),
      mbdp_(micro_batch_size * dp_size),
      active_(total - total % (micro_batch_size * dp_size)),
      perm_size_(data_sharding ? total / (micro_batch_size * dp_size) * micro_batch_size
                               : total / micro_batch_size * micro_batch_size),
      sharding_(data_sharding) {
  MEGATRON_ASSERT(micro_batch_size > 0 && dp_size > 0, "bad sampler shape");
  MEGATRON_CHECK(active_ > 0, "--dataloader-type cyclic: the dataset has ", total,
                 " samples, fewer than one micro-batch per data-parallel rank (", micro_batch_size,
                 " x ", dp_size, "); use more data or a smaller --micro-batch-size");
}

std::shared_ptr<const std::vector<int64_t>> RandomSampler::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [e, p] : cache_)
    if (e == epoch) return p;
  // Built under the lock: the readers of one source want the same epoch, and building it twice
  // would cost more than waiting.
  auto p = std::make_shared<const std::vector<int64_t>>(
      torch_randperm(perm_size_, static_cast<uint64_t>(epoch)));
  if (cache_.size() == 2) cache_.erase(cache_.begin());
  cache_.emplace_back(epoch, p);
  return p;
}

int64_t RandomSampler::index(int64_t position) const {
  MEGATRON_ASSERT(position >= 0, "negative sample position");
  const int64_t consumed = position / mbdp_ * mbdp_;  // the micro-step's first position
  const int64_t within = position - consumed;
  const int64_t r = within / b_, t = within % b_;
  const int64_t epoch = consumed / active_, in_epoch = consumed % active_;
  const std::shared_ptr<const std::vector<int64_t>> perm = permutation(epoch);
  if (sharding_) {
    const int64_t bucket = perm_size_;
    return r * bucket + (*perm)[static_cast<size_t>(in_epoch / dp_ + t)];
  }
  return (*perm)[static_cast<size_t>(in_epoch + t * dp_ + r)];
}

SampledSource::SampledSource(std::unique_ptr<SampleSource> inner, int64_t micro_batch_size,
                             int64_t dp_size, bool data_sharding)
    : inner_(std::move(inner)),
      sampler_(inner_->size(), micro_batch_size, dp_size, data_sharding) {}

int64_t SampledSource::size() const {
  return std::numeric_limits<int64_t>::max() / 2;
}

void SampledSource::sample(int64_t index, int64_t* out) const {
  inner_->sample(sampler_.index(index), out);
}

}  // namespace megatron
