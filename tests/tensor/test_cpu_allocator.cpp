// The host allocator's reuse of large blocks (tensor/cpu/cpu_allocator.cpp): sizes in one size
// class share a block, so that tensors whose row count changes from step to step (an MoE layer's
// routed rows) do not each keep a block of their own; release_cached empties the cache.
#include <gtest/gtest.h>

#include <cstring>

#include "tensor/allocator.h"

namespace megatron {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostAllocator, SizesInOneClassReuseTheFreedBlock) {
  Allocator& a = allocator_for(Device::kCPU);
  a.release_cached();
  // 5.1 and 5.4 MiB both round up to the 5.5 MiB class (classes 0.5 MiB apart between 4 and 8).
  const size_t small = 5 * kMiB + 100 * 1024, large = 5 * kMiB + 400 * 1024;
  void* first = a.allocate(small);
  std::memset(first, 1, small);
  a.release(first, small);
  void* second = a.allocate(large);
  EXPECT_EQ(second, first) << "a 5.4 MiB request did not reuse the freed 5.1 MiB block";
  std::memset(second, 2, large);  // the whole request is writable
  a.release(second, large);
  // 5.6 MiB is in the next class (6 MiB): a block of its own.
  void* other = a.allocate(5 * kMiB + 600 * 1024);
  EXPECT_NE(other, first);
  a.release(other, 5 * kMiB + 600 * 1024);
  a.release_cached();
}

}  // namespace
}  // namespace megatron
