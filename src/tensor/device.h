// Device: where a tensor's storage lives and which implementation of an op runs on it.
#pragma once

#include <cstdint>
#include <string>

namespace megatron {

enum class Device : uint8_t {
  kCPU,        // host memory; the oneDNN/OpenMP kernels of tensor/cpu/
  kReference,  // host memory; the naive fp64 kernels of tensor/reference/ (the specification
               // every other device is tested against; f64 tensors and integer ids only)
  kCUDA,       // GPU memory; cuBLASLt and the kernels of tensor/cuda/ (builds with a CUDA toolkit)
};

inline const char* device_name(Device d) {
  switch (d) {
    case Device::kCPU:
      return "cpu";
    case Device::kReference:
      return "reference";
    case Device::kCUDA:
      return "cuda";
  }
  return "unknown";
}

// Whether tensors can live on `device` in this process: always for the host devices; for CUDA,
// when the build has the CUDA device and a GPU is visible. *why says why not.
bool device_available(Device device, std::string* why = nullptr);
// What the device is, for logs: the GPU's name, compute capability and memory; "host" otherwise.
std::string device_description(Device device);
// Waits until the device has finished the work queued so far (timing; a no-op on the host).
void device_synchronize(Device device);

}  // namespace megatron
