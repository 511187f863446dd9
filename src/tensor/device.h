// Device: where a tensor's storage lives and which implementation of an op runs on it.
#pragma once

#include <cstdint>

namespace megatron {

enum class Device : uint8_t {
  kCPU,  // host memory; the oneDNN/OpenMP kernels of tensor/cpu/
};

inline const char* device_name(Device d) {
  switch (d) {
    case Device::kCPU:
      return "cpu";
  }
  return "unknown";
}

}  // namespace megatron
