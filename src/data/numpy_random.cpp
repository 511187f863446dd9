// NumPy's legacy RandomState: see the header.
#include "data/numpy_random.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace megatron {

NumpyRandomState::NumpyRandomState(uint32_t seed) : mt_(seed) {}

uint64_t NumpyRandomState::next_uint64() {
  const uint64_t high = next_uint32();
  return (high << 32) | next_uint32();
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    do {
      value = next_uint32() & mask;
    } while (value > max);
  } else {
    do {
      value = next_uint64() & mask;
    } while (value > max);
  }
  return value;
}

double NumpyRandomState::random() {
  const uint32_t a = next_uint32() >> 5, b = next_uint32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

int64_t NumpyRandomState::randint(int64_t low, int64_t high) {
  MEGATRON_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  return low + static_cast<int64_t>(random_interval(static_cast<uint64_t>(high - 1 - low)));
}

int64_t NumpyRandomState::choice_index(std::span<const double> p) {
  MEGATRON_CHECK(!p.empty(), "choice: no probabilities");
  std::vector<double> cdf(p.begin(), p.end());
  for (size_t i = 1; i < cdf.size(); ++i) cdf[i] += cdf[i - 1];
  const double last = cdf.back();
  for (double& c : cdf) c /= last;
  const double u = random();
  // searchsorted(side="right"): the first entry greater than u.
  return static_cast<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
}

int64_t NumpyRandomState::binomial_one(double p) {
  MEGATRON_CHECK(p >= 0 && p <= 1, "binomial: p = ", p, " is outside [0, 1]");
  // RandomState keeps the original binomial, without the Generator's early return for p = 0:
  // random_binomial_inversion(n = 1, p') with p' = min(p, 1 - p), mirrored for p > 1/2. Its
  // arithmetic for n = 1: P(X = 0) = exp(log q) with q = 1 - p', then P(X = 1) = p' P(X = 0) / q;
  // the bound min(n, ...) is 1, so a draw that rounding carries past X = 1 starts over.
  const double pp = p <= 0.5 ? p : 1.0 - p;
  const double q = 1.0 - pp;
  const double p0 = std::exp(std::log(q));
  const double p1 = pp * p0 / q;
  auto mirrored = [&](int64_t x) { return p <= 0.5 ? x : 1 - x; };
  for (;;) {
    const double u = random();
    if (u <= p0) return mirrored(0);
    if (u - p0 <= p1) return mirrored(1);
  }
}

int64_t NumpyRandomState::geometric(double p) {
  MEGATRON_CHECK(p > 0 && p < 1.0 / 3, "geometric: p = ", p,
                 " is outside (0, 1/3), the range NumPy samples by inversion");
  return static_cast<int64_t>(std::ceil(std::log1p(-random()) / std::log(1 - p)));
}

}  // namespace megatron
