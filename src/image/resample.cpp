// Pillow's bicubic resize of 8-bit images, reproduced exactly (image/resample.h).
#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace megatron::image {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis: for each output index, the first input index it reads, how many, and their weights
// in fixed point (Pillow's precompute_coeffs and normalize_coeffs_8bpc).
struct Axis {
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out, ksize]
  int ksize = 0;
};

Axis coefficients(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  Axis ax;
  ax.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  ax.first.resize(static_cast<size_t>(out_size));
  ax.count.resize(static_cast<size_t>(out_size));
  ax.weights.assign(static_cast<size_t>(out_size * ax.ksize), 0);
  std::vector<double> k(static_cast<size_t>(ax.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = static_cast<int>(in_size);
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic((x + xmin - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[static_cast<size_t>(x)] /= ww;
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = k[static_cast<size_t>(x)] * (1 << kPrecisionBits);
      ax.weights[static_cast<size_t>(xx * ax.ksize + x)] =
          static_cast<int32_t>(v < 0 ? -0.5 + v : 0.5 + v);
    }
    ax.first[static_cast<size_t>(xx)] = xmin;
    ax.count[static_cast<size_t>(xx)] = xmax;
  }
  return ax;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic: floor for negative sums
  return static_cast<uint8_t>(std::clamp(s, 0, 255));
}

// [rows, width_in, c] -> [rows, width_out, c], input rows from `row0`.
std::vector<uint8_t> horizontal(const std::vector<uint8_t>& in, int64_t width_in, int c,
                                int64_t row0, int64_t rows, const Axis& ax, int64_t width_out) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * width_out * c));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* src = in.data() + (row0 + y) * width_in * c;
    for (int64_t x = 0; x < width_out; ++x) {
      const int32_t* k = ax.weights.data() + x * ax.ksize;
      const int first = ax.first[static_cast<size_t>(x)], n = ax.count[static_cast<size_t>(x)];
      for (int ch = 0; ch < c; ++ch) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < n; ++i) ss += src[(first + i) * c + ch] * k[i];
        out[static_cast<size_t>((y * width_out + x) * c + ch)] = clip8(ss);
      }
    }
  }
  return out;
}

// [rows_in, width, c] -> [height_out, width, c]; the axis's first rows are relative to the input.
std::vector<uint8_t> vertical(const std::vector<uint8_t>& in, int64_t width, int c, const Axis& ax,
                              int64_t height_out, int64_t shift) {
  std::vector<uint8_t> out(static_cast<size_t>(height_out * width * c));
  for (int64_t y = 0; y < height_out; ++y) {
    const int32_t* k = ax.weights.data() + y * ax.ksize;
    const int64_t first = ax.first[static_cast<size_t>(y)] - shift;
    const int n = ax.count[static_cast<size_t>(y)];
    for (int64_t x = 0; x < width; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < n; ++i)
          ss += in[static_cast<size_t>(((first + i) * width + x) * c + ch)] * k[i];
        out[static_cast<size_t>((y * width + x) * c + ch)] = clip8(ss);
      }
    }
  }
  return out;
}

// Pillow's two-pass ImagingResampleInner on interleaved 8-bit samples.
std::vector<uint8_t> bicubic_resize(const std::vector<uint8_t>& in, int64_t w, int64_t h, int c,
                                    int64_t out_w, int64_t out_h) {
  const Axis hx = coefficients(w, out_w), vy = coefficients(h, out_h);
  const bool need_h = out_w != w, need_v = out_h != h;
  if (!need_h && !need_v) return in;
  std::vector<uint8_t> cur = in;
  int64_t shift = 0;
  if (need_h) {
    // Only the rows the vertical pass reads.
    const int64_t first = vy.first.front();
    const int64_t last = vy.first.back() + vy.count.back();
    cur = horizontal(in, w, c, need_v ? first : 0, need_v ? last - first : h, hx, out_w);
    shift = need_v ? first : 0;
  }
  if (!need_v) return cur;
  return vertical(cur, out_w, c, vy, out_h, shift);
}

// Pillow's nearest-neighbour scaling (ImagingScaleAffine): positions accumulated in double.
std::vector<uint8_t> nearest_resize(const std::vector<uint8_t>& in, int64_t w, int64_t h, int c,
                                    int64_t out_w, int64_t out_h) {
  auto table = [](int64_t in_size, int64_t out_size) {
    const double step = static_cast<double>(static_cast<float>(in_size)) / out_size;
    std::vector<int64_t> at(static_cast<size_t>(out_size));
    double pos = step * 0.5;
    for (int64_t i = 0; i < out_size; ++i) {
      at[static_cast<size_t>(i)] = std::min<int64_t>(static_cast<int64_t>(pos), in_size - 1);
      pos += step;
    }
    return at;
  };
  const std::vector<int64_t> xs = table(w, out_w), ys = table(h, out_h);
  std::vector<uint8_t> out(static_cast<size_t>(out_w * out_h * c));
  for (int64_t y = 0; y < out_h; ++y)
    for (int64_t x = 0; x < out_w; ++x)
      for (int ch = 0; ch < c; ++ch)
        out[static_cast<size_t>((y * out_w + x) * c + ch)] = in[static_cast<size_t>(
            (ys[static_cast<size_t>(y)] * w + xs[static_cast<size_t>(x)]) * c + ch)];
  return out;
}

// Pillow's MULDIV255: a * b / 255 rounded, in integers.
uint8_t muldiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

// RGBA -> RGBa / LA -> La (premultiplied), and back, as Pillow's converters do.
void premultiply(std::vector<uint8_t>& px, int c) {
  for (size_t i = 0; i < px.size(); i += static_cast<size_t>(c)) {
    const unsigned alpha = px[i + static_cast<size_t>(c) - 1];
    for (int ch = 0; ch + 1 < c; ++ch)
      px[i + static_cast<size_t>(ch)] = muldiv255(px[i + static_cast<size_t>(ch)], alpha);
  }
}

void unpremultiply(std::vector<uint8_t>& px, int c) {
  for (size_t i = 0; i < px.size(); i += static_cast<size_t>(c)) {
    const unsigned alpha = px[i + static_cast<size_t>(c) - 1];
    if (alpha == 255 || alpha == 0) continue;  // kept as they are (Pillow)
    for (int ch = 0; ch + 1 < c; ++ch) {
      uint8_t& v = px[i + static_cast<size_t>(ch)];
      v = static_cast<uint8_t>(std::min(255u, 255u * v / alpha));
    }
  }
}

}  // namespace

Image resize_bicubic(const Image& in, int64_t width, int64_t height) {
  MEGATRON_CHECK(width > 0 && height > 0, "image resize to ", width, " x ", height,
                 ": sizes must be positive");
  MEGATRON_CHECK(in.width > 0 && in.height > 0 &&
                     static_cast<int64_t>(in.pixels.size()) == in.width * in.height * in.channels(),
                 "image resize: a ", in.width, " x ", in.height, " ", mode_name(in.mode),
                 " image with ", in.pixels.size(), " bytes");
  Image out;
  out.width = width;
  out.height = height;
  out.mode = in.mode;
  const int c = static_cast<int>(in.channels());
  if (width == in.width && height == in.height) {
    out.pixels = in.pixels;
    return out;
  }
  if (in.mode == Mode::kP) {
    out.pixels = nearest_resize(in.pixels, in.width, in.height, c, width, height);
    return out;
  }
  if (in.mode == Mode::kRGBA || in.mode == Mode::kLA) {
    std::vector<uint8_t> pre = in.pixels;
    premultiply(pre, c);
    out.pixels = bicubic_resize(pre, in.width, in.height, c, width, height);
    unpremultiply(out.pixels, c);
    return out;
  }
  out.pixels = bicubic_resize(in.pixels, in.width, in.height, c, width, height);
  return out;
}

}  // namespace megatron::image
