// Philox4x32-10 counter-based random numbers (Salmon et al., SC'11).
//
// Every random number is a pure function of (seed, counter): dropout masks can be regenerated in
// backward instead of stored, and any parallel layout draws the same numbers for the same
// element. This is not a stateful generator; callers own their counters.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace megatron {

struct Philox {
  // Four 32-bit outputs for 128-bit counter (c0..c3) under 64-bit key `seed`.
  static std::array<uint32_t, 4> block(uint64_t seed, uint64_t c_lo, uint64_t c_hi) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    uint32_t c0 = static_cast<uint32_t>(c_lo), c1 = static_cast<uint32_t>(c_lo >> 32);
    uint32_t c2 = static_cast<uint32_t>(c_hi), c3 = static_cast<uint32_t>(c_hi >> 32);
    for (int r = 0; r < 10; ++r) {
      uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
      uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return {c0, c1, c2, c3};
  }

  // Uniform in [0, 1) with 24 bits, the j-th (0..3) lane of block `index` of stream `stream`.
  static float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    auto b = block(seed, index >> 2, stream);
    return static_cast<float>(b[index & 3] >> 8) * (1.0f / 16777216.0f);
  }

  // Standard normal by Box-Muller from one block; element `index` of stream `stream`.
  static double normal(uint64_t seed, uint64_t stream, uint64_t index) {
    auto b = block(seed, index >> 1, stream);
    int lane = static_cast<int>(index & 1) * 2;
    // 32-bit uniforms in (0, 1]: avoid log(0).
    double u1 = (static_cast<double>(b[lane]) + 1.0) / 4294967296.0;
    double u2 = static_cast<double>(b[lane + 1]) / 4294967296.0;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace megatron
