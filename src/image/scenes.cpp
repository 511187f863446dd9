// The scenes task (image/scenes.h): attributes from Philox counters, shapes drawn by testing each
// pixel's centre.
#include "image/scenes.h"

#include <cmath>

#include "core/error.h"
#include "core/philox.h"

namespace megatron::image {
namespace {

constexpr uint64_t kStream = 0x5CE7E5;  // the scenes' Philox stream

int pick(uint64_t seed, int64_t index, int k, int n) {
  const float u = Philox::uniform(seed, kStream, static_cast<uint64_t>(index) * 8 + k);
  return std::min(n - 1, static_cast<int>(u * static_cast<float>(n)));
}

float uniform(uint64_t seed, int64_t index, int k) {
  return Philox::uniform(seed, kStream, static_cast<uint64_t>(index) * 8 + k);
}

constexpr uint8_t kColourRgb[4][3] = {{220, 40, 40}, {40, 170, 60}, {40, 80, 220}, {235, 200, 30}};
constexpr float kPlaceCentre[5][2] = {
    {0.27f, 0.27f}, {0.73f, 0.27f}, {0.27f, 0.73f}, {0.73f, 0.73f}, {0.5f, 0.5f}};
constexpr float kRadius[2] = {0.1f, 0.2f};  // half the shape's extent, fraction of the side

}  // namespace

Scene scene_at(uint64_t seed, int64_t index) {
  Scene s;
  s.shape = pick(seed, index, 0, static_cast<int>(kSceneShapes.size()));
  s.colour = pick(seed, index, 1, static_cast<int>(kSceneColours.size()));
  s.size = pick(seed, index, 2, static_cast<int>(kSceneSizes.size()));
  s.place = pick(seed, index, 3, static_cast<int>(kScenePlaces.size()));
  s.dx = (uniform(seed, index, 4) - 0.5f) * 0.08f;
  s.dy = (uniform(seed, index, 5) - 0.5f) * 0.08f;
  s.shade = uniform(seed, index, 6);
  return s;
}

std::string scene_caption(const Scene& s) {
  const std::string place = kScenePlaces[static_cast<size_t>(s.place)];
  return std::string("a ") + kSceneSizes[static_cast<size_t>(s.size)] + " " +
         kSceneColours[static_cast<size_t>(s.colour)] + " " +
         kSceneShapes[static_cast<size_t>(s.shape)] +
         (place == "center" ? " in the center" : " at the " + place);
}

std::vector<std::string> scene_vocabulary() {
  std::vector<std::string> words{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                 "a",     "at",    "in",    "the"};
  for (const char* w : kSceneSizes) words.emplace_back(w);
  for (const char* w : kSceneColours) words.emplace_back(w);
  for (const char* w : kSceneShapes) words.emplace_back(w);
  for (const char* w : {"top", "bottom", "left", "right", "center"}) words.emplace_back(w);
  return words;
}

Image render_scene(const Scene& s, int64_t side) {
  MEGATRON_CHECK(side >= 16, "scenes: --img-size must be at least 16, got ", side);
  Image img;
  img.width = img.height = side;
  img.mode = Mode::kRGB;
  img.pixels.resize(static_cast<size_t>(side * side * 3));
  const float n = static_cast<float>(side);
  const float cx = (kPlaceCentre[s.place][0] + s.dx) * n,
              cy = (kPlaceCentre[s.place][1] + s.dy) * n;
  const float r = kRadius[s.size] * n;
  const float dim = 1.0f - 0.15f * s.shade;  // shade: up to 15% darker
  const auto background = static_cast<uint8_t>(235.0f * dim);
  for (int64_t y = 0; y < side; ++y) {
    for (int64_t x = 0; x < side; ++x) {
      const float px = static_cast<float>(x) + 0.5f - cx, py = static_cast<float>(y) + 0.5f - cy;
      bool inside = false;
      if (s.shape == 0) {
        inside = px * px + py * py <= r * r;
      } else if (s.shape == 1) {
        inside = std::fabs(px) <= r * 0.9f && std::fabs(py) <= r * 0.9f;
      } else {  // upright triangle: apex above the centre, base below
        inside = py <= r && py >= -r && std::fabs(px) <= (py + r) * 0.5f;
      }
      uint8_t* p = &img.pixels[static_cast<size_t>((y * side + x) * 3)];
      for (int c = 0; c < 3; ++c)
        p[c] = inside ? static_cast<uint8_t>(static_cast<float>(kColourRgb[s.colour][c]) * dim)
                      : background;
    }
  }
  return img;
}

}  // namespace megatron::image
