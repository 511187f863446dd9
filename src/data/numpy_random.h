// NumPy's legacy random stream, `numpy.random.RandomState(seed)`, as far as Megatron's datasets
// use it: seeding with a 32-bit integer, `shuffle` of a 1-D array or list, `random()`,
// `randint(low, high)`, `choice(a, p=...)` and `geometric(p)` (masked-LM sample construction),
// `binomial(1, p)` (fill-in-the-middle samples).
//
// Megatron shuffles its document and sample indices with RandomState, so a run is sample-identical
// to Megatron's only if our shuffles are bit-identical to NumPy's. RandomState is frozen by NumPy's
// compatibility policy (it is the "legacy" generator), which is what makes this worth matching.
// This is not a general NumPy port: no distributions, no array seeding, no Generator (PCG64).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace megatron {

class NumpyRandomState {
 public:
  // RandomState(seed) for an integer seed, which NumPy requires in [0, 2^32).
  explicit NumpyRandomState(uint32_t seed);

  // One MT19937 output (NumPy's next_uint32).
  uint32_t next_uint32() { return static_cast<uint32_t>(mt_()); }
  // Two outputs, the first one in the high half (NumPy's mt19937_next64).
  uint64_t next_uint64();
  // Uniform integer in [0, max] by masked rejection (NumPy's random_interval): draw, keep the bits
  // under the smallest all-ones mask >= max, retry while the value exceeds max. 32-bit draws when
  // max fits in 32 bits, else 64-bit draws.
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle of a 1-D array: Fisher-Yates from the last element down, swapping x[i]
  // with x[random_interval(i)] for i = n-1 .. 1. The element type does not enter the stream.
  // RandomState.random(): 53 bits from two draws (NumPy's legacy_double / random_sample).
  double random();
  // RandomState.randint(low, high) for a scalar: low + random_interval(high - 1 - low).
  int64_t randint(int64_t low, int64_t high);
  // The index RandomState.choice(a, p=p) picks for probabilities p (one random() against the
  // cumulative sum, normalised by its last entry, searched to the right).
  int64_t choice_index(std::span<const double> p);
  // RandomState.geometric(p), for p < 1/3 (inversion: ceil(log1p(-U) / log(1 - p))), the only
  // range the datasets use (SpanBERT's p = 0.2).
  int64_t geometric(double p);
  // RandomState.binomial(1, p): NumPy's inversion for n = 1 (its choice for n p <= 30), on
  // min(p, 1 - p) and mirrored for p > 1/2. One draw, p = 0 and 1 included (rarely more: the
  // inversion restarts when rounding carries it past n).
  int64_t binomial_one(double p);

  template <typename T>
  void shuffle(std::span<T> x) {
    for (size_t i = x.size(); i-- > 1;) {
      const size_t j = static_cast<size_t>(random_interval(i));
      std::swap(x[i], x[j]);
    }
  }

 private:
  // std::mt19937 is specified bit for bit by the C++ standard, and its integer-seed constructor
  // is Matsumoto and Nishimura's init_genrand, which is what NumPy's mt19937_seed does.
  std::mt19937 mt_;
};

}  // namespace megatron
