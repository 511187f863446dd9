// The image pipeline's own checks (Pillow itself is the oracle in test_pil_parity.py): the
// bicubic resize against a double-precision restatement of its definition, the RGB conversion,
// the CLIP transform's arithmetic, and decoding errors that name the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "image/clip_transform.h"
#include "image/decode.h"
#include "image/resample.h"

namespace megatron::image {
namespace {

Image pattern(int64_t w, int64_t h, Mode mode) {
  Image img;
  img.width = w;
  img.height = h;
  img.mode = mode;
  img.pixels.resize(static_cast<size_t>(w * h * img.channels()));
  for (size_t i = 0; i < img.pixels.size(); ++i)
    img.pixels[i] = static_cast<uint8_t>((i * 37 + (i / 7) * 11) % 256);
  return img;
}

double cubic(double x) {  // Keys' kernel with a = -0.5
  x = std::fabs(x);
  if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

// One axis in doubles: output i centred at (i + 0.5) s, taps within 2 max(s, 1), weights
// normalised; the result rounded and clamped to 8 bits, as each of Pillow's passes is.
std::vector<double> axis_weights(int64_t in, int64_t out, int64_t i, int64_t* first) {
  const double s = static_cast<double>(in) / static_cast<double>(out), f = std::max(s, 1.0);
  const double c = (static_cast<double>(i) + 0.5) * s;
  const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(c - 2 * f + 0.5));
  const int64_t hi = std::min<int64_t>(in, static_cast<int64_t>(c + 2 * f + 0.5));
  std::vector<double> w;
  double sum = 0;
  for (int64_t x = lo; x < hi; ++x) {
    w.push_back(cubic((static_cast<double>(x) + 0.5 - c) / f));
    sum += w.back();
  }
  for (double& v : w) v /= sum;
  *first = lo;
  return w;
}

uint8_t to8(double v) {
  return static_cast<uint8_t>(std::min(255.0, std::max(0.0, std::floor(v + 0.5))));
}

TEST(ImageResize, BicubicMatchesItsDefinitionInDoublesWithinOneLevel) {
  // Fixed-point weights (22 fraction bits) against doubles: each pass's sum differs by far less
  // than half a level, so a pixel differs by at most one level (a rounding tie broken the other
  // way, in either pass).
  for (auto [w, h, ow, oh] :
       {std::array<int64_t, 4>{37, 23, 16, 11}, std::array<int64_t, 4>{12, 9, 31, 20},
        std::array<int64_t, 4>{40, 8, 13, 8}}) {
    const Image in = pattern(w, h, Mode::kRGB);
    const Image out = resize_bicubic(in, ow, oh);
    // Horizontal pass, then vertical, both in doubles.
    std::vector<uint8_t> mid(static_cast<size_t>(h * ow * 3));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        int64_t first = 0;
        const std::vector<double> k = axis_weights(w, ow, x, &first);
        for (int c = 0; c < 3; ++c) {
          double s = 0;
          for (size_t t = 0; t < k.size(); ++t)
            s += k[t] * in.at(y, first + static_cast<int64_t>(t), c);
          mid[static_cast<size_t>((y * ow + x) * 3 + c)] = ow == w ? in.at(y, x, c) : to8(s);
        }
      }
    int worst = 0;
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        int64_t first = 0;
        const std::vector<double> k = axis_weights(h, oh, y, &first);
        for (int c = 0; c < 3; ++c) {
          double s = 0;
          for (size_t t = 0; t < k.size(); ++t)
            s += k[t] *
                 mid[static_cast<size_t>(((first + static_cast<int64_t>(t)) * ow + x) * 3 + c)];
          const int want = oh == h ? mid[static_cast<size_t>((y * ow + x) * 3 + c)] : to8(s);
          worst = std::max(worst, std::abs(want - out.at(y, x, c)));
        }
      }
    EXPECT_LE(worst, 1) << w << "x" << h << " -> " << ow << "x" << oh;
  }
}

TEST(ImageResize, SameSizeIsACopyAndPaletteImagesTakeNearestPixels) {
  const Image in = pattern(10, 6, Mode::kRGB);
  EXPECT_EQ(resize_bicubic(in, 10, 6).pixels, in.pixels);
  // Halving a palette image: output pixel i takes input floor((i + 0.5) 2) = 2 i + 1.
  Image p = pattern(8, 4, Mode::kP);
  const Image half = resize_bicubic(p, 4, 2);
  for (int64_t y = 0; y < 2; ++y)
    for (int64_t x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(half.at(y, x, c), p.at(2 * y + 1, 2 * x + 1, c));
  EXPECT_THROW(resize_bicubic(in, 0, 3), InvalidArgument);
}

TEST(ImageTransform, RgbConversionAndClipNormalisation) {
  Image gray = pattern(3, 2, Mode::kL);
  const Image rgb = to_rgb(gray);
  for (int64_t i = 0; i < 6; ++i)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(rgb.pixels[static_cast<size_t>(i * 3 + c)], gray.pixels[static_cast<size_t>(i)]);
  const Image rgba = pattern(2, 2, Mode::kRGBA);
  const Image dropped = to_rgb(rgba);
  EXPECT_EQ(dropped.pixels[5], rgba.pixels[6]);  // pixel 1, blue
  // No resize (same size): (v / 255 - mean) / std, channel-major.
  const Image img = pattern(4, 3, Mode::kRGB);
  const Tensor t = clip_pixels(img, 3, 4);
  ASSERT_EQ(t.shape(), Shape({3, 3, 4}));
  for (int c = 0; c < 3; ++c)
    for (int64_t i = 0; i < 12; ++i) {
      const float v = static_cast<float>(img.pixels[static_cast<size_t>(i * 3 + c)]) / 255.0f;
      EXPECT_EQ(t.data<float>()[c * 12 + i],
                (v - kClipMean[static_cast<size_t>(c)]) / kClipStd[static_cast<size_t>(c)]);
    }
}

TEST(ImageDecode, ErrorsNameTheFile) {
  auto message = [](const std::vector<uint8_t>& bytes) {
    try {
      decode(bytes, "shots/cat.jpg");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("shots/cat.jpg"), std::string::npos);
  EXPECT_NE(message({'G', 'I', 'F', '8'}).find("neither a JPEG nor a PNG"), std::string::npos);
  // A JPEG signature and nothing else; a PNG signature and nothing else.
  EXPECT_NE(message({0xFF, 0xD8, 0xFF, 0xE0}).find("cannot decode this JPEG"), std::string::npos);
  EXPECT_NE(message({0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}).find("cannot decode this PNG"),
            std::string::npos);
  try {
    read_file("no/such/image.png");
    FAIL() << "a missing file was read";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/image.png"), std::string::npos);
  }
}

}  // namespace
}  // namespace megatron::image
