// The CUDA runtime behind cuda_context.h and kernels.h's host helpers: error reporting, copies,
// the per-thread kernel workspaces, and the caching allocator.
#include "tensor/cuda/cuda_context.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <new>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "tensor/cuda/kernels.h"

namespace megatron::cuda {

void cuda_fail(const char* what, const char* message) {
  throw InternalError(std::string("CUDA: ") + what + ": " + message);
}

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(what, cudaGetErrorString(e));
}
}  // namespace

void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

bool usable(std::string* why) {
  // Asked on every allocation: probed once (GPUs do not come and go within a process).
  static const std::string reason = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error of the failed probe
      return std::string(cudaGetErrorString(e));
    }
    return n == 0 ? std::string("no CUDA GPU is visible") : std::string();
  }();
  if (why) *why = reason;
  return reason.empty();
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string describe() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  std::ostringstream os;
  os << p.name << ", sm_" << p.major << p.minor << ", "
     << static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024 * 1024) << " GiB";
  return os.str();
}

void set_device(int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
}

void synchronize() {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  copy(dst, src, bytes, CopyKind::kDeviceToHost);
}

void zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, 0), "cudaMemsetAsync");
}

void* workspace(size_t bytes, int slot) {
  // Grown, never shrunk; freed with the thread (after the device is done with it).
  struct Slot {
    void* p = nullptr;
    size_t bytes = 0;
    ~Slot() {
      if (p) {
        cudaDeviceSynchronize();
        cudaFree(p);
      }
    }
  };
  thread_local Slot slots[4];
  MEGATRON_ASSERT(slot >= 0 && slot < 4, "workspace slot ", slot);
  Slot& s = slots[slot];
  if (s.bytes < bytes) {
    if (s.p) {
      check(cudaDeviceSynchronize(), "workspace");  // kernels may still read the old buffer
      check(cudaFree(s.p), "cudaFree");
    }
    s.p = nullptr;
    check(cudaMalloc(&s.p, bytes), "cudaMalloc (kernel workspace)");
    s.bytes = bytes;
  }
  return s.p;
}

namespace {

// Blocks are rounded (512 bytes below 1 MiB, 2 MiB above) and reused by exact rounded size.
class DeviceAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCUDA; }

  void* allocate(size_t bytes) override {
    const size_t rounded = round(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= static_cast<int64_t>(rounded);
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMalloc(&p, rounded) != cudaSuccess) {
      cudaGetLastError();
      release_cached();
      if (cudaMalloc(&p, rounded) != cudaSuccess) {
        cudaGetLastError();
        throw std::bad_alloc();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.reserved_bytes += static_cast<int64_t>(rounded);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.device_mallocs;
    return p;
  }

  void release(void* p, size_t bytes) override {
    if (!p) return;
    const size_t rounded = round(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[rounded].push_back(p);
    stats_.cached_bytes += static_cast<int64_t>(rounded);
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  static size_t round(size_t bytes) {
    constexpr size_t kSmall = size_t{1} << 20, kLarge = size_t{2} << 20;
    if (bytes == 0) bytes = 512;
    return bytes >= kSmall ? (bytes + kLarge - 1) / kLarge * kLarge : (bytes + 511) / 512 * 512;
  }
  void release_cached() {
    cudaDeviceSynchronize();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        cudaFree(p);
        stats_.reserved_bytes -= static_cast<int64_t>(size);
      }
      blocks.clear();
    }
    stats_.cached_bytes = 0;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

DeviceAllocator& device_allocator() {
  static DeviceAllocator* a = new DeviceAllocator();  // never destroyed: outlives static tensors
  return *a;
}

}  // namespace

Allocator& allocator() {
  return device_allocator();
}

AllocatorStats allocator_stats() {
  return device_allocator().stats();
}

}  // namespace megatron::cuda
