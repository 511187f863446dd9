// NumPy's legacy RandomState: see the header.
#include "data/numpy_random.h"

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

}  // namespace megatron
