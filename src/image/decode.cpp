// JPEG (libjpeg) and PNG (libpng) decoding with Pillow's settings (image/decode.h). Both
// libraries report errors by longjmp: each decoder runs in a function whose frame holds no C++
// object with a destructor, and the C++ side turns a failure into an error naming the file.
#include "image/decode.h"

#include <jpeglib.h>
// After jpeglib.h: the message codes (JWRN_JPEG_EOF).
#include <jerror.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace megatron::image {

int channels(Mode m) {
  switch (m) {
    case Mode::kL:
      return 1;
    case Mode::kLA:
      return 2;
    case Mode::kRGB:
    case Mode::kP:
      return 3;
    case Mode::kRGBA:
      return 4;
  }
  return 3;
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kL:
      return "L";
    case Mode::kLA:
      return "LA";
    case Mode::kRGB:
      return "RGB";
    case Mode::kRGBA:
      return "RGBA";
    case Mode::kP:
      return "P";
  }
  return "?";
}

namespace {

// ---- JPEG ------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are not errors (extraneous bytes, say), except a file that ends early: libjpeg would
// fill the rest with gray, where Pillow refuses the file ("image file is truncated").
void jpeg_warning(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(err->message, sizeof err->message, "the file ends early (truncated)");
    std::longjmp(err->jump, 1);
  }
}

// Decodes into `out` (sized by the caller's callback); returns false with err->message set.
// The header is read first so that the caller can size the buffer: `alloc` gets the width,
// height and channels and returns where the rows go (nullptr: refuse, message in err).
using JpegAlloc = uint8_t* (*)(void* ctx, int64_t w, int64_t h, int c, char* why);

bool jpeg_run(const uint8_t* data, size_t n, JpegError* err, JpegAlloc alloc, void* ctx) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_warning;
  jpeg_create_decompress(&cinfo);
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  int c = 0;
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
    c = 1;
  } else if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_RGB) {
    cinfo.out_color_space = JCS_RGB;
    c = 3;
  } else {
    std::snprintf(err->message, sizeof err->message,
                  "a CMYK or YCCK JPEG (colour space %d); convert it to RGB",
                  static_cast<int>(cinfo.jpeg_color_space));
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_start_decompress(&cinfo);
  uint8_t* rows = alloc(ctx, cinfo.output_width, cinfo.output_height, c, err->message);
  if (!rows) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const size_t stride = static_cast<size_t>(cinfo.output_width) * static_cast<size_t>(c);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = rows + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// ---- PNG -------------------------------------------------------------------------------------

struct PngRead {
  const uint8_t* data;
  size_t size, at;
  char message[256];
  png_bytep* rows;  // here, not in png_run's frame: it changes between setjmp and a longjmp
};

void png_fail(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_quiet(png_structp, png_const_charp) {}

void png_source(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngRead*>(png_get_io_ptr(png));
  if (n > r->size - r->at) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, r->data + r->at, n);
  r->at += n;
}

// What the PNG holds and how it is read: `samples` per pixel after libpng's transforms, and the
// palette (palette images are read as indices and expanded by the caller).
struct PngShape {
  int64_t width = 0, height = 0;
  int samples = 0;
  Mode mode = Mode::kRGB;
  bool palette = false, one_bit_gray = false;
  png_color colours[256];
  int num_colours = 0;
};

using PngAlloc = uint8_t* (*)(void* ctx, const PngShape& shape, char* why);

bool png_run(PngRead* r, PngShape* s, PngAlloc alloc, void* ctx) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r, png_fail, png_quiet);
  if (!png) {
    std::snprintf(r->message, sizeof r->message, "libpng could not start");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  r->rows = nullptr;
  if (setjmp(png_jmpbuf(png))) {
    png_free(png, r->rows);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, r, png_source);
  png_read_info(png, info);
  const int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  s->width = png_get_image_width(png, info);
  s->height = png_get_image_height(png, info);
  if (type == PNG_COLOR_TYPE_GRAY && depth == 16)
    png_error(png,
              "a 16-bit grayscale PNG (Pillow reads it as 'I;16' and clips it at 255 when "
              "converting to RGB); convert it to 8 bits");
  if (depth == 16) png_set_strip_16(png);  // the high byte, as Pillow's "RGB;16B" unpacking
  if (type == PNG_COLOR_TYPE_PALETTE) {
    png_colorp plte = nullptr;
    if (!png_get_PLTE(png, info, &plte, &s->num_colours)) png_error(png, "no palette (PLTE)");
    std::memcpy(s->colours, plte, sizeof(png_color) * static_cast<size_t>(s->num_colours));
    if (depth < 8) png_set_packing(png);  // one index per byte
    s->palette = true;
    s->samples = 1;
    s->mode = Mode::kP;
  } else if (type == PNG_COLOR_TYPE_GRAY && depth == 1) {
    // Pillow's mode "1": black and white, resized by nearest neighbour like a palette.
    png_set_packing(png);
    s->one_bit_gray = true;
    s->samples = 1;
    s->mode = Mode::kP;
  } else if (type == PNG_COLOR_TYPE_GRAY) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(png);  // x 85 or x 17, as Pillow's L;2, L;4
    s->samples = 1;
    s->mode = Mode::kL;
  } else if (type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    s->samples = 2;
    s->mode = Mode::kLA;
  } else if (type == PNG_COLOR_TYPE_RGB) {
    s->samples = 3;
    s->mode = Mode::kRGB;
  } else {
    s->samples = 4;
    s->mode = Mode::kRGBA;
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<png_size_t>(s->width * s->samples))
    png_error(png, "unexpected row size after the transforms");
  uint8_t* pixels = alloc(ctx, *s, r->message);
  if (!pixels) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  r->rows =
      static_cast<png_bytep*>(png_malloc(png, sizeof(png_bytep) * static_cast<size_t>(s->height)));
  for (int64_t y = 0; y < s->height; ++y)
    r->rows[y] = pixels + static_cast<size_t>(y * s->width * s->samples);
  png_read_image(png, r->rows);
  png_read_end(png, nullptr);
  png_free(png, r->rows);
  r->rows = nullptr;
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// Largest decoded image accepted (pixels): a corrupt header must not ask for terabytes.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

bool sane(int64_t w, int64_t h, char* why, size_t n) {
  if (w <= 0 || h <= 0 || w * h > kMaxPixels) {
    std::snprintf(why, n, "image size %lld x %lld is empty or beyond %lld pixels",
                  static_cast<long long>(w), static_cast<long long>(h),
                  static_cast<long long>(kMaxPixels));
    return false;
  }
  return true;
}

Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& name) {
  struct Ctx {
    Image img;
  } ctx;
  JpegError err{};
  const JpegAlloc alloc = [](void* p, int64_t w, int64_t h, int c, char* why) -> uint8_t* {
    if (!sane(w, h, why, JMSG_LENGTH_MAX)) return nullptr;
    auto* x = static_cast<Ctx*>(p);
    x->img.width = w;
    x->img.height = h;
    x->img.mode = c == 1 ? Mode::kL : Mode::kRGB;
    x->img.pixels.assign(static_cast<size_t>(w * h * c), 0);
    return x->img.pixels.data();
  };
  MEGATRON_CHECK(jpeg_run(bytes.data(), bytes.size(), &err, alloc, &ctx), "image ", name,
                 ": cannot decode this JPEG: ", err.message);
  return std::move(ctx.img);
}

Image decode_png(const std::vector<uint8_t>& bytes, const std::string& name) {
  struct Ctx {
    std::vector<uint8_t> raw;
  } ctx;
  PngRead r{bytes.data(), bytes.size(), 0, {}, nullptr};
  PngShape s;
  const PngAlloc alloc = [](void* p, const PngShape& shape, char* why) -> uint8_t* {
    if (!sane(shape.width, shape.height, why, 256)) return nullptr;
    auto* x = static_cast<Ctx*>(p);
    x->raw.assign(static_cast<size_t>(shape.width * shape.height * shape.samples), 0);
    return x->raw.data();
  };
  MEGATRON_CHECK(png_run(&r, &s, alloc, &ctx), "image ", name,
                 ": cannot decode this PNG: ", r.message);
  Image img;
  img.width = s.width;
  img.height = s.height;
  img.mode = s.mode;
  if (s.mode != Mode::kP) {
    img.pixels = std::move(ctx.raw);
    return img;
  }
  // Palette indices (or 1-bit gray) to their RGB colours.
  img.pixels.resize(ctx.raw.size() * 3);
  for (size_t i = 0; i < ctx.raw.size(); ++i) {
    uint8_t rgb[3];
    if (s.one_bit_gray) {
      rgb[0] = rgb[1] = rgb[2] = ctx.raw[i] ? 255 : 0;
    } else {
      MEGATRON_CHECK(ctx.raw[i] < s.num_colours, "image ", name,
                     ": cannot decode this PNG: ", "palette index ", static_cast<int>(ctx.raw[i]),
                     " beyond its ", s.num_colours, " colours");
      const png_color& c = s.colours[ctx.raw[i]];
      rgb[0] = c.red;
      rgb[1] = c.green;
      rgb[2] = c.blue;
    }
    std::memcpy(&img.pixels[i * 3], rgb, 3);
  }
  return img;
}

}  // namespace

Image decode(const std::vector<uint8_t>& bytes, const std::string& name) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return decode_png(bytes, name);
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return decode_jpeg(bytes, name);
  MEGATRON_CHECK(false, "image ", name, ": neither a JPEG nor a PNG file (",
                 bytes.empty() ? "it is empty" : "unknown first bytes",
                 "); give JPEG or PNG images");
  __builtin_unreachable();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), "image ", path, ": cannot open it (missing or unreadable)");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

Image read_file(const std::string& path) {
  return decode(read_bytes(path), path);
}

}  // namespace megatron::image
