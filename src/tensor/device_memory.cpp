// Memory operations by device. Without the CUDA device in the build, asking for CUDA memory is a
// clear error naming the fix, never a crash.
#include "tensor/device_memory.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/error.h"
#include "tensor/op_profile.h"

#if MEGATRON_HAVE_CUDA
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/kernels.h"
#endif

namespace megatron {

#if !MEGATRON_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda() {
  throw InvalidArgument(
      "this build of megatron has no CUDA device: configure it with a CUDA toolkit "
      "(cmake -DMEGATRON_CUDA=ON) or use --device cpu");
}
}  // namespace
#endif

bool device_available(Device device, std::string* why) {
  if (is_host_memory(device)) return true;
#if MEGATRON_HAVE_CUDA
  return cuda::usable(why);
#else
  if (why) *why = "this build has no CUDA device (configured without a CUDA toolkit)";
  return false;
#endif
}

std::string device_description(Device device) {
  if (is_host_memory(device)) return "host";
#if MEGATRON_HAVE_CUDA
  return cuda::describe();
#else
  no_cuda();
#endif
}

namespace {
std::atomic<bool> tf32_allowed{false};
}  // namespace

void set_cuda_tf32(bool allow) {
  tf32_allowed.store(allow, std::memory_order_relaxed);
}

bool cuda_tf32() {
  return tf32_allowed.load(std::memory_order_relaxed);
}

int gpu_count() {
#if MEGATRON_HAVE_CUDA
  return cuda::usable(nullptr) ? cuda::device_count() : 0;
#else
  return 0;
#endif
}

void use_gpu(int index) {
#if MEGATRON_HAVE_CUDA
  cuda::set_device(index);
#else
  (void)index;
  no_cuda();
#endif
}

void device_synchronize(Device device) {
  if (is_host_memory(device)) return;
#if MEGATRON_HAVE_CUDA
  cuda::synchronize();
#else
  no_cuda();
#endif
}

namespace detail {

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (is_host_memory(dst_device) && is_host_memory(src_device)) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if MEGATRON_HAVE_CUDA
  const cuda::CopyKind kind = is_host_memory(src_device)   ? cuda::CopyKind::kHostToDevice
                              : is_host_memory(dst_device) ? cuda::CopyKind::kDeviceToHost
                                                           : cuda::CopyKind::kDeviceToDevice;
  cuda::copy(dst, src, bytes, kind);
#else
  no_cuda();
#endif
}

void zero_bytes(void* dst, Device device, size_t bytes) {
  if (is_host_memory(device)) {
    // Large buffers (a step's gradients: 0.5 GB for 124M parameters) in one contiguous range per
    // thread: one core's stores do not fill the memory bandwidth (2 cores of a Zen 4: 9.6 -> 7
    // ms for 500 MB).
    constexpr size_t kParallelBytes = size_t{4} << 20, kPage = 4096;
    if (bytes < kParallelBytes) {
      std::memset(dst, 0, bytes);
      return;
    }
#pragma omp parallel
    {
      const auto threads = static_cast<size_t>(omp_get_num_threads());
      const size_t chunk = (bytes / threads + kPage - 1) / kPage * kPage;
      const size_t begin = static_cast<size_t>(omp_get_thread_num()) * chunk;
      if (begin < bytes)
        std::memset(static_cast<char*>(dst) + begin, 0, std::min(chunk, bytes - begin));
    }
    return;
  }
#if MEGATRON_HAVE_CUDA
  cuda::zero(dst, bytes);
#else
  no_cuda();
#endif
}

void convert_on(Device device, void* dst, DType dst_type, const void* src, DType src_type,
                int64_t n) {
  // In the op profile: conversions are the bf16 runs' GEMM-input roundings.
  const OpTimer timer(OpCategory::kNormElementwise, dst_type == src_type ? "copy" : "convert");
  if (is_host_memory(device)) {
    convert(dst, dst_type, src, src_type, n);
    return;
  }
#if MEGATRON_HAVE_CUDA
  if (dst_type == src_type) {
    cuda::copy(dst, src, static_cast<size_t>(n) * dtype_size(src_type),
               cuda::CopyKind::kDeviceToDevice);
  } else {
    cuda::convert(dst, static_cast<int>(dst_type), src, static_cast<int>(src_type), n);
  }
#else
  no_cuda();
#endif
}

void fill_on(Device device, void* dst, DType type, double value, int64_t n) {
  MEGATRON_ASSERT(!is_host_memory(device), "fill_on is for device memory");
#if MEGATRON_HAVE_CUDA
  cuda::fill(dst, static_cast<int>(type), value, n);
#else
  (void)dst, (void)type, (void)value, (void)n;
  no_cuda();
#endif
}

}  // namespace detail
}  // namespace megatron
