// Megatron's CLIP image transform (image/clip_transform.h).
#include "image/clip_transform.h"

#include "core/error.h"
#include "image/resample.h"

namespace megatron::image {

Image to_rgb(const Image& in) {
  if (in.mode == Mode::kRGB || in.mode == Mode::kP) {
    Image out = in;
    out.mode = Mode::kRGB;
    return out;
  }
  Image out;
  out.width = in.width;
  out.height = in.height;
  out.mode = Mode::kRGB;
  const int64_t n = in.width * in.height;
  out.pixels.resize(static_cast<size_t>(n * 3));
  for (int64_t i = 0; i < n; ++i) {
    for (int ch = 0; ch < 3; ++ch) {
      // Gray replicated into R, G, B; RGBA's alpha dropped.
      const int64_t from = in.mode == Mode::kRGBA ? i * 4 + ch : i * in.channels();
      out.pixels[static_cast<size_t>(i * 3 + ch)] = in.pixels[static_cast<size_t>(from)];
    }
  }
  return out;
}

Image clip_resize(const Image& in, int64_t img_h, int64_t img_w) {
  MEGATRON_CHECK(img_h > 0 && img_w > 0, "--img-h and --img-w must be positive, got ", img_h,
                 " and ", img_w);
  return to_rgb(resize_bicubic(in, img_w, img_h));
}

void clip_normalize(const uint8_t* rgb, int64_t img_h, int64_t img_w, float* out,
                    const std::array<float, 3>& mean, const std::array<float, 3>& std) {
  const int64_t plane = img_h * img_w;
  for (int ch = 0; ch < 3; ++ch) {
    for (int64_t i = 0; i < plane; ++i) {
      // float32 throughout, in torchvision's order: v / 255, then (x - mean) / std.
      const float x = static_cast<float>(rgb[i * 3 + ch]) / 255.0f;
      out[ch * plane + i] = (x - mean[static_cast<size_t>(ch)]) / std[static_cast<size_t>(ch)];
    }
  }
}

Tensor clip_pixels(const Image& in, int64_t img_h, int64_t img_w, const std::array<float, 3>& mean,
                   const std::array<float, 3>& std) {
  const Image rgb = clip_resize(in, img_h, img_w);
  Tensor out = Tensor::empty({3, img_h, img_w}, DType::kF32);
  clip_normalize(rgb.pixels.data(), img_h, img_w, out.data<float>(), mean, std);
  return out;
}

}  // namespace megatron::image
