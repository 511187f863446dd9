// Pillow's Image.resize((width, height), BICUBIC) on 8-bit images, reproduced exactly (Pillow's
// libImaging/Resample.c), since Megatron's image transforms call it (torchvision's Resize on a
// PIL image):
//   - each axis separately, horizontal first; output pixel i of an axis of scale s = in / out is
//     centred at (i + 0.5) s in input coordinates and reads the input pixels within
//     2 max(s, 1) of it (the bicubic kernel, a = -0.5, widened by the scale when shrinking,
//     which is the antialiasing), weights normalised to sum 1;
//   - weights in fixed point with 22 fraction bits, products summed in integers with half added,
//     the result shifted back and clamped to 0..255 after each pass;
//   - "RGBA" and "LA" are resized premultiplied by alpha ("RGBa", "La") and divided back after,
//     as Pillow does; "P" (palette) is resized by nearest neighbour (Pillow never interpolates
//     palette indices): output pixel i takes input floor((i + 0.5) s).
#pragma once

#include <cstdint>

#include "image/image.h"

namespace megatron::image {

Image resize_bicubic(const Image& in, int64_t width, int64_t height);

}  // namespace megatron::image
