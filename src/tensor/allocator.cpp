// allocator_for: the host allocators, or the CUDA device's caching allocator where the build has
// it and a GPU is visible.
#include "tensor/allocator.h"

#include <string>

#include "core/error.h"
#include "tensor/device_memory.h"

#if MEGATRON_HAVE_CUDA
#include "tensor/cuda/cuda_context.h"
#endif

namespace megatron {

Allocator& allocator_for(Device device) {
  if (is_host_memory(device)) return detail::host_allocator(device);
  std::string why;
  MEGATRON_CHECK(device_available(device, &why), "cannot allocate on the ", device_name(device),
                 " device: ", why);
#if MEGATRON_HAVE_CUDA
  return cuda::allocator();
#else
  return detail::host_allocator(Device::kCPU);  // unreachable: device_available said no
#endif
}

}  // namespace megatron
