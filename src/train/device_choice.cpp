#include "train/device_choice.h"

#include "core/error.h"

namespace megatron {

Device resolve_device(const std::string& choice) {
  MEGATRON_CHECK(choice == "auto" || choice == "cpu" || choice == "cuda",
                 "--device must be cpu, cuda or auto, got '", choice, "'");
  if (choice == "cpu") return Device::kCPU;
  std::string why;
  const bool gpu = device_available(Device::kCUDA, &why);
  MEGATRON_CHECK(gpu || choice == "auto", "--device cuda: no usable GPU (", why,
                 "); run with --device cpu");
  return gpu ? Device::kCUDA : Device::kCPU;
}

}  // namespace megatron
