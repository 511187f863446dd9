// The scenes task: a vision-language problem whose answers can be checked. Each scene is one
// shape (circle, square, triangle) of one colour (red, green, blue, yellow) and size (small,
// large) at one of five places (top left, top right, bottom left, bottom right, center) on a
// light background, drawn with a little jitter in place and shade; its true caption names the
// four, e.g. "a large red circle at the top left". A model that sees the image can get every
// word right; one that sees only text can do no better than guessing each attribute (1 in 120
// for the whole caption). The scenes of a seed are the same on every machine (Philox counters).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"

namespace megatron::image {

inline constexpr std::array<const char*, 3> kSceneShapes = {"circle", "square", "triangle"};
inline constexpr std::array<const char*, 4> kSceneColours = {"red", "green", "blue", "yellow"};
inline constexpr std::array<const char*, 2> kSceneSizes = {"small", "large"};
inline constexpr std::array<const char*, 5> kScenePlaces = {"top left", "top right", "bottom left",
                                                            "bottom right", "center"};

struct Scene {
  int shape = 0, colour = 0, size = 0, place = 0;
  float dx = 0, dy = 0;  // jitter of the centre, in fractions of the image side (|d| <= 0.04)
  float shade = 0;       // in [0, 1): darkens the colour and the background a little
};

// A WordPiece vocabulary of every caption word, BERT's special tokens first.
std::vector<std::string> scene_vocabulary();

// Scene `index` of `seed`.
Scene scene_at(uint64_t seed, int64_t index);
// Its true caption: "a <size> <colour> <shape> at the <place>" ("in the center").
std::string scene_caption(const Scene& s);
// The scene drawn as a side x side RGB image (side >= 16).
Image render_scene(const Scene& s, int64_t side);

}  // namespace megatron::image
