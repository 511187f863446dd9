// The image pipeline as a command, for tests/image/test_pil_parity.py (Pillow is the oracle):
//   image_tool decode FILE OUT          the decoded pixels
//   image_tool resize FILE W H OUT      Pillow's bicubic resize of them
//   image_tool clip FILE H W OUT        Megatron's CLIP transform, [3, H, W] float32
// writes the raw bytes (pixels as [H, W, C] uint8, the transform as float32) to OUT and prints
// "WIDTH HEIGHT MODE". A bad file: its message on stderr, exit 2.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "image/clip_transform.h"
#include "image/decode.h"
#include "image/resample.h"

namespace {

void write(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

int run(int argc, char** argv) {
  using namespace megatron::image;
  const std::string op = argc > 1 ? argv[1] : "";
  if (op == "decode" && argc == 4) {
    const Image img = read_file(argv[2]);
    write(argv[3], img.pixels.data(), img.pixels.size());
    std::printf("%lld %lld %s\n", static_cast<long long>(img.width),
                static_cast<long long>(img.height), mode_name(img.mode));
    return 0;
  }
  if (op == "resize" && argc == 6) {
    const Image img = resize_bicubic(read_file(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]));
    write(argv[5], img.pixels.data(), img.pixels.size());
    std::printf("%lld %lld %s\n", static_cast<long long>(img.width),
                static_cast<long long>(img.height), mode_name(img.mode));
    return 0;
  }
  if (op == "clip" && argc == 6) {
    const int64_t h = std::atoll(argv[3]), w = std::atoll(argv[4]);
    const megatron::Tensor t = clip_pixels(read_file(argv[2]), h, w);
    write(argv[5], t.raw(), t.nbytes());
    std::printf("%lld %lld RGB\n", static_cast<long long>(w), static_cast<long long>(h));
    return 0;
  }
  std::fprintf(stderr,
               "usage: image_tool decode FILE OUT | resize FILE W H OUT | clip FILE H W OUT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
