// Philox4x32-10 against the known-answer vectors of its authors' reference implementation
// (Random123's kat_vectors): a wrong round constant or key schedule changes every output bit.
#include <gtest/gtest.h>

#include "core/philox.h"

namespace megatron {
namespace {

TEST(Philox, KnownAnswerVectors) {
  // counter (c0, c1, c2, c3), key (k0, k1) packed as Philox::block takes them.
  auto block = [](uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    return Philox::block((static_cast<uint64_t>(k1) << 32) | k0,
                         (static_cast<uint64_t>(c1) << 32) | c0,
                         (static_cast<uint64_t>(c3) << 32) | c2);
  };
  const std::array<uint32_t, 4> zeros = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  EXPECT_EQ(block(0, 0, 0, 0, 0, 0), zeros);
  const std::array<uint32_t, 4> ones = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
  EXPECT_EQ(block(~0u, ~0u, ~0u, ~0u, ~0u, ~0u), ones);
  const std::array<uint32_t, 4> pi = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  EXPECT_EQ(block(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u),
            pi);
}

TEST(Philox, UniformAndNormalAreInRangeAndCentred) {
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = Philox::uniform(1, 2, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const double z = Philox::normal(1, 2, static_cast<uint64_t>(i));
    sum += z;
    sum_sq += z * z;
  }
  // Mean of n standard normals has sd 1/sqrt(n) = 0.0022; variance estimate sd ~ sqrt(2/n).
  EXPECT_NEAR(sum / n, 0.0, 0.011);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.016);
}

}  // namespace
}  // namespace megatron
