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
  // random_binomial_inversion(n = 1, p') with p' = min(p, 1 - p), its arithmetic as written:
  // q = 1 - p', P(X = 0) = exp(n log q), the bound min(n, n p' + 10 sqrt(n p' q + 1)) = 1.
  const double pp = p <= 0.5 ? p : 1.0 - p;
  const double q = 1.0 - pp;
  const double qn = std::exp(1.0 * std::log(q));
  const double bound = std::min(1.0, pp + 10.0 * std::sqrt(pp * q + 1));
  int64_t x = 0;
  double px = qn;
  double u = random();
  while (u > px) {
    ++x;
    if (static_cast<double>(x) > bound) {
      x = 0;
      px = qn;
      u = random();
    } else {
      u -= px;
      px = (static_cast<double>(1 - x + 1) * pp * px) / (static_cast<double>(x) * q);
    }
  }
  return p <= 0.5 ? x : 1 - x;
}

int64_t NumpyRandomState::geometric(double p) {
  MEGATRON_CHECK(p > 0 && p < 1.0 / 3, "geometric: p = ", p,
                 " is outside (0, 1/3), the range NumPy samples by inversion");
  return static_cast<int64_t>(std::ceil(std::log1p(-random()) / std::log(1 - p)));
}

}  // namespace megatron
