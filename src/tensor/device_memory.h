// Byte-level memory operations on any device's storage, for Tensor (tensor.cpp) and the
// allocators: host devices use memcpy/memset and core/dtype.h's conversions, the CUDA device its
// runtime and conversion kernels. Not for use outside tensor/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "tensor/device.h"

namespace megatron::detail {

// Copies `bytes` from src (on src_device) to dst (on dst_device).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void zero_bytes(void* dst, Device device, size_t bytes);
// Converts n elements, both buffers on `device`.
void convert_on(Device device, void* dst, DType dst_type, const void* src, DType src_type,
                int64_t n);
void fill_on(Device device, void* dst, DType type, double value, int64_t n);

}  // namespace megatron::detail
