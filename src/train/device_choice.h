// --device: where the model computes. "auto" is the GPU where this build has the CUDA device and
// one is visible, else the CPU; "cuda" without a usable GPU is an error naming the reason.
#pragma once

#include <string>

#include "tensor/device.h"

namespace megatron {

Device resolve_device(const std::string& choice);

}  // namespace megatron
