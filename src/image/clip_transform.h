// Megatron's image transform for a CLIP vision encoder (examples/multimodal/image_processing.py,
// vision model type "clip"): resize to img_h x img_w with Pillow's bicubic filter
// (image/resample.h; no aspect-ratio crop), convert to RGB, scale to [0, 1] (torchvision's
// ToTensor: v / 255 in float32) and normalise per channel with CLIP's mean and std
// ((x - mean) / std in float32), giving a [3, img_h, img_w] tensor.
#pragma once

#include <array>
#include <cstdint>

#include "image/image.h"
#include "tensor/tensor.h"

namespace megatron::image {

// CLIP's pixel statistics (OpenAI's), Megatron's CLIP_PIXEL_MEAN / CLIP_PIXEL_STD.
inline constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
inline constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};

// `in` converted to RGB as Pillow's convert("RGB") does: gray replicated, alpha dropped.
Image to_rgb(const Image& in);

// The transform's two halves: the resized RGB image (8-bit, what a dataset can keep), and its
// normalisation into out[3, h, w] (channel planes) from interleaved RGB rgb[h w 3].
Image clip_resize(const Image& in, int64_t img_h, int64_t img_w);
void clip_normalize(const uint8_t* rgb, int64_t img_h, int64_t img_w, float* out,
                    const std::array<float, 3>& mean = kClipMean,
                    const std::array<float, 3>& std = kClipStd);

// The transform: [3, img_h, img_w] f32.
Tensor clip_pixels(const Image& in, int64_t img_h, int64_t img_w,
                   const std::array<float, 3>& mean = kClipMean,
                   const std::array<float, 3>& std = kClipStd);

}  // namespace megatron::image
