// Tensor memory statistics: the bytes held by live Storage objects now, and the most held at
// once since the last reset_peak_tensor_bytes(). Counts the bytes tensors asked for (numel x
// dtype size), not the allocator's rounding and not the blocks it keeps cached for reuse, so
// differences of live_tensor_bytes() are exact bookkeeping of what a piece of code keeps alive.
// Process-wide and thread-safe; it is not a profiler (no per-site attribution).
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatron {

int64_t live_tensor_bytes();
int64_t peak_tensor_bytes();
// Sets the peak to the current live bytes.
void reset_peak_tensor_bytes();

namespace detail {
// Called by Storage only.
void note_storage_alloc(size_t bytes);
void note_storage_free(size_t bytes);
}  // namespace detail

}  // namespace megatron
