// Image: decoded 8-bit pixels as Pillow holds them, the input of the vision encoders'
// preprocessing (image/clip_transform.h).
//
// Modes are Pillow's, because Megatron's image pipelines run on PIL images and what a resize does
// depends on the mode: "L" (gray), "LA" (gray + alpha), "RGB", "RGBA", and "P" (palette), kept
// here already expanded to its RGB colours (a palette image is resized by nearest neighbour, as
// Pillow resizes "P", so expanding first changes nothing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::image {

enum class Mode : uint8_t { kL, kLA, kRGB, kRGBA, kP };

// Channels per pixel of a mode (P: its expanded RGB).
int channels(Mode m);
const char* mode_name(Mode m);  // "L", "LA", "RGB", "RGBA", "P"

struct Image {
  int64_t width = 0, height = 0;
  Mode mode = Mode::kRGB;
  std::vector<uint8_t> pixels;  // [height, width, channels(mode)], row-major

  int64_t channels() const { return image::channels(mode); }
  uint8_t at(int64_t y, int64_t x, int64_t c) const {
    return pixels[static_cast<size_t>((y * width + x) * channels() + c)];
  }
};

}  // namespace megatron::image
