// PNG encoding by libpng (the scenes task writes its images with it).
#pragma once

#include <cstdint>
#include <vector>

#include "image/image.h"

namespace megatron::image {

// An "L", "LA", "RGB" or "RGBA" image as PNG file bytes (8 bits per sample, no interlacing).
std::vector<uint8_t> encode_png(const Image& img);

}  // namespace megatron::image
