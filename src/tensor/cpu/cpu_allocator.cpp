// The host allocators (the CPU device's and the reference device's): 64-byte aligned host
// memory, large freed blocks kept for reuse.
//
// The trainer allocates the same activation buffers every micro-batch; handing them back to the
// OS (glibc maps anything above 32 MiB separately) would make every step pay page faults and page
// zeroing again, ~10% of a step. Blocks of at least 1 MiB are rounded up to a size class (8 per
// power of two) and reused by class; at most kMaxCached bytes are held. Process-wide by nature (it
// is memory), and thread-safe.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tensor/allocator.h"

namespace megatron {
namespace {

class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(Device device) : device_(device) {}

  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kGranule = size_t{1} << 16;
  static constexpr size_t kMaxCached = size_t{4} << 30;

  Device device() const override { return device_; }

  void* allocate(size_t bytes) override {
    const size_t rounded = round(bytes);
    void* p = take(rounded);
    if (!p) p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }

  void release_cached() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  void release(void* p, size_t bytes) override {
    if (!give(p, round(bytes))) std::free(p);
  }

 private:
  // Blocks of at least kMinBytes come in 8 size classes per power of two (at most 12.5% above
  // the request, in untouched pages that never become resident), so that tensors whose row
  // count varies from step to step (an MoE layer's routed rows) reuse each other's blocks
  // instead of each new size keeping a block of its own.
  static size_t round(size_t bytes) {
    if (bytes == 0) bytes = 64;
    if (bytes < kMinBytes) return (bytes + 63) / 64 * 64;
    size_t octave = kMinBytes;
    while (octave * 2 <= bytes) octave *= 2;
    const size_t step = std::max(octave / 8, kGranule);
    return (bytes + step - 1) / step * step;
  }
  void* take(size_t rounded) {
    if (rounded < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    return p;
  }
  bool give(void* p, size_t rounded) {
    if (rounded < kMinBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + rounded > kMaxCached) return false;
    free_[rounded].push_back(p);
    cached_ += rounded;
    return true;
  }

  Device device_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

}  // namespace

Allocator& detail::host_allocator(Device device) {
  // Never destroyed: they outlive static tensors.
  static HostAllocator* cpu = new HostAllocator(Device::kCPU);
  static HostAllocator* reference = new HostAllocator(Device::kReference);
  switch (device) {
    case Device::kCPU:
      return *cpu;
    case Device::kReference:
      return *reference;
    case Device::kCUDA:
      break;
  }
  MEGATRON_ASSERT(false, "no host allocator for device ", device_name(device));
  return *cpu;
}

}  // namespace megatron
