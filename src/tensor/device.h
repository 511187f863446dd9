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

// Whether the device's storage is host memory (readable through Tensor::data on the CPU).
inline bool is_host_memory(Device d) {
  return d == Device::kCPU || d == Device::kReference;
}

// Whether tensors can live on `device` in this process: always for the host devices; for CUDA,
// when the build has the CUDA device and a GPU is visible. *why says why not.
bool device_available(Device device, std::string* why = nullptr);
// What the device is, for logs: the GPU's name, compute capability and memory; "host" otherwise.
std::string device_description(Device device);
// GPUs visible to this process (0 without the CUDA device), and the one this process's CUDA
// tensors and kernels use from now on (one per rank: the local rank modulo the count).
int gpu_count();
void use_gpu(int index);
// Whether the CUDA device's f32 GEMMs may use TF32 tensor cores (10-bit mantissa products, about
// 8x faster on A100/H100; --tf32). Off by default: f32 runs then match the CPU device to f32
// rounding. Process-wide, like the device itself.
void set_cuda_tf32(bool allow);
bool cuda_tf32();
// Waits until the device has finished the work queued so far (timing; a no-op on the host).
void device_synchronize(Device device);

}  // namespace megatron
