// PNG encoding through libpng's write API into memory (image/encode.h).
#include "image/encode.h"

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace megatron::image {
namespace {

struct PngWrite {
  std::vector<uint8_t>* out;
  char message[256];
  png_bytep* rows;  // here, not in the frame that calls setjmp
};

void write_fail(png_structp png, png_const_charp msg) {
  auto* w = static_cast<PngWrite*>(png_get_error_ptr(png));
  std::snprintf(w->message, sizeof w->message, "%s", msg);
  png_longjmp(png, 1);
}

void write_quiet(png_structp, png_const_charp) {}

void sink(png_structp png, png_bytep data, png_size_t n) {
  auto* w = static_cast<PngWrite*>(png_get_io_ptr(png));
  w->out->insert(w->out->end(), data, data + n);
}

void flush(png_structp) {}

bool run(const Image& img, int type, PngWrite* w) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, w, write_fail, write_quiet);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  w->rows = nullptr;
  if (setjmp(png_jmpbuf(png))) {
    png_free(png, w->rows);
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, w, sink, flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(img.width), static_cast<png_uint_32>(img.height),
               8, type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  w->rows =
      static_cast<png_bytep*>(png_malloc(png, sizeof(png_bytep) * static_cast<size_t>(img.height)));
  const size_t stride = static_cast<size_t>(img.width * img.channels());
  for (int64_t y = 0; y < img.height; ++y)
    w->rows[y] = const_cast<png_bytep>(img.pixels.data()) + static_cast<size_t>(y) * stride;
  png_write_image(png, w->rows);
  png_write_end(png, nullptr);
  png_free(png, w->rows);
  w->rows = nullptr;
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_png(const Image& img) {
  int type = 0;
  switch (img.mode) {
    case Mode::kL:
      type = PNG_COLOR_TYPE_GRAY;
      break;
    case Mode::kLA:
      type = PNG_COLOR_TYPE_GRAY_ALPHA;
      break;
    case Mode::kRGB:
    case Mode::kP:  // kept as its RGB colours
      type = PNG_COLOR_TYPE_RGB;
      break;
    case Mode::kRGBA:
      type = PNG_COLOR_TYPE_RGB_ALPHA;
      break;
  }
  MEGATRON_CHECK(
      img.width > 0 && img.height > 0 &&
          static_cast<int64_t>(img.pixels.size()) == img.width * img.height * img.channels(),
      "encode_png: a ", img.width, " x ", img.height, " ", mode_name(img.mode), " image with ",
      img.pixels.size(), " bytes");
  std::vector<uint8_t> out;
  PngWrite w{&out, {}, nullptr};
  MEGATRON_CHECK(run(img, type, &w), "encode_png: libpng failed: ", w.message);
  return out;
}

}  // namespace megatron::image
