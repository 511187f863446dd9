// The CUDA device's runtime, as the rest of tensor/ sees it: whether a GPU is usable, its name,
// byte copies between host and device, the device allocator and its statistics. Only
// tensor/device_memory.cpp, tensor/allocator.cpp and the CUDA op implementations include this;
// everyone else goes through Tensor and ops.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/allocator.h"

namespace megatron::cuda {

// Whether a GPU is visible and works; *why says why not (the CUDA runtime's words).
bool usable(std::string* why);
// "<name>, sm_<major><minor>, <GiB> GiB" of the current GPU.
std::string describe();
// Selects GPU `index` for this process's allocations and kernels (one GPU per rank).
void set_device(int index);
int device_count();
void synchronize();

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
void copy(void* dst, const void* src, size_t bytes, CopyKind kind);
void zero(void* dst, size_t bytes);

// The caching device allocator (cudaMalloc'd blocks reused by rounded size; everything cached is
// given back and the allocation retried once when the GPU is out of memory).
Allocator& allocator();
struct AllocatorStats {
  int64_t reserved_bytes = 0;       // held from the driver now (in use + cached)
  int64_t peak_reserved_bytes = 0;  // the most ever held
  int64_t cached_bytes = 0;         // free blocks kept for reuse
  int64_t device_mallocs = 0;       // cudaMalloc calls made
};
AllocatorStats allocator_stats();

}  // namespace megatron::cuda
