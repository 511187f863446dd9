// Device: where a tensor's storage lives and which implementation of an op runs on it.
#pragma once

#include <cstdint>

namespace megatron {

enum class Device : uint8_t {
  kCPU,        // host memory; the oneDNN/OpenMP kernels of tensor/cpu/
  kReference,  // host memory; the naive fp64 kernels of tensor/reference/ (the specification
               // every other device is tested against; f64 tensors and integer ids only)
};

inline const char* device_name(Device d) {
  switch (d) {
    case Device::kCPU:
      return "cpu";
    case Device::kReference:
      return "reference";
  }
  return "unknown";
}

}  // namespace megatron
