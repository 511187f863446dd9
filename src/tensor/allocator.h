// Allocator: where tensor storage comes from, one per device (ggml's buffer type, one level
// simpler).
//
// Tensor::empty asks the allocator of the device it is given for its storage; the storage gives
// the block back to the same allocator when the last tensor sharing it goes. The CPU allocator
// keeps large freed blocks for reuse (tensor/cpu/cpu_allocator.cpp); a CUDA device adds its own
// behind the same interface. Not a memory pool for kernels' scratch space: kernels allocate
// tensors like everyone else.
#pragma once

#include <cstddef>

#include "tensor/device.h"

namespace megatron {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // `bytes` (0 allowed) of storage aligned to 64 bytes; throws std::bad_alloc.
  virtual void* allocate(size_t bytes) = 0;
  // Gives back a block `allocate(bytes)` returned, with the same `bytes`.
  virtual void release(void* p, size_t bytes) = 0;
  // Hands the blocks kept for reuse back to the system (PyTorch's empty_cache): after one-off
  // work whose block sizes the run will not ask for again (the planner's measurements).
  virtual void release_cached() {}
};

// The process-wide allocator of `device` (never destroyed: it outlives static tensors). Throws
// InvalidArgument for a device this build or machine does not have.
Allocator& allocator_for(Device device);

namespace detail {
// The host devices' allocators (tensor/cpu/cpu_allocator.cpp).
Allocator& host_allocator(Device device);
}  // namespace detail

}  // namespace megatron
