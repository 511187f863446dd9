// `megatron scenes`: writes the scenes task's data (image/scenes.h), PNG images with their true
// captions, as a JSONL manifest with an images/ folder or as WebDataset tar shards
// (image/image_text_data.h), the two formats vision-language training reads. Scenes are numbered;
// scene i of a seed is the same on every machine, so a held-out set is another range of the same
// seed (--first-index past the training range).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "image/encode.h"
#include "image/image_text_data.h"
#include "image/scenes.h"

namespace megatron::cli {

int scenes_command(int argc, char** argv) {
  CLI::App app("Write the scenes task's images and true captions", "scenes");
  std::string output_dir, format = "jsonl";
  int64_t num_samples = 0, first_index = 0, img_size = 64, per_shard = 1000;
  uint64_t seed = 1234;
  app.add_option("--output-dir", output_dir, "Directory to write into (created)")->required();
  app.add_option("--num-samples", num_samples, "Scenes to write")->required();
  app.add_option("--first-index", first_index,
                 "Number of the first scene (a held-out set: past the training range)")
      ->capture_default_str();
  app.add_option("--seed", seed, "Scenes of a seed are the same everywhere")->capture_default_str();
  app.add_option("--img-size", img_size, "Image side in pixels (at least 16)")
      ->capture_default_str();
  app.add_option("--format", format,
                 "jsonl: DIR/scenes.jsonl + DIR/images/*.png; wds: DIR/scenes-NNNNNN.tar")
      ->check(CLI::IsMember({"jsonl", "wds"}))
      ->capture_default_str();
  app.add_option("--samples-per-shard", per_shard, "Samples per WebDataset shard")
      ->capture_default_str();
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  MEGATRON_CHECK(num_samples > 0, "--num-samples must be positive, got ", num_samples);
  MEGATRON_CHECK(first_index >= 0, "--first-index must be >= 0, got ", first_index);
  MEGATRON_CHECK(img_size >= 16, "--img-size must be at least 16, got ", img_size);
  MEGATRON_CHECK(per_shard > 0, "--samples-per-shard must be positive, got ", per_shard);
  const std::filesystem::path dir = output_dir;
  std::error_code ec;
  std::filesystem::create_directories(format == "jsonl" ? dir / "images" : dir, ec);
  MEGATRON_CHECK(!ec, "--output-dir ", output_dir, ": cannot create it (", ec.message(), ")");

  auto sample = [&](int64_t i) {
    const image::Scene s = image::scene_at(seed, i);
    image::ImageTextSample out;
    char key[32];
    std::snprintf(key, sizeof key, "%08lld", static_cast<long long>(i));
    out.key = key;
    out.image_ext = "png";
    out.image = image::encode_png(image::render_scene(s, img_size));
    out.text = image::scene_caption(s);
    return out;
  };
  {
    // A WordPiece vocabulary of the captions' words (--tokenizer-type BertWordPieceLowerCase
    // --vocab-file DIR/vocab.txt): a language model of 25 tokens instead of GPT-2's 50257.
    std::ofstream vocab(dir / "vocab.txt");
    for (const std::string& w : image::scene_vocabulary()) vocab << w << "\n";
    MEGATRON_CHECK(vocab.good(), "--output-dir ", output_dir, ": cannot write vocab.txt");
  }
  if (format == "jsonl") {
    const std::filesystem::path manifest = dir / "scenes.jsonl";
    std::ofstream out(manifest);
    MEGATRON_CHECK(out.good(), "--output-dir ", output_dir, ": cannot write ", manifest.string());
    for (int64_t i = first_index; i < first_index + num_samples; ++i) {
      const image::ImageTextSample s = sample(i);
      const std::string rel = "images/" + s.key + ".png";
      std::ofstream img(dir / rel, std::ios::binary);
      img.write(reinterpret_cast<const char*>(s.image.data()),
                static_cast<std::streamsize>(s.image.size()));
      MEGATRON_CHECK(img.good(), "--output-dir ", output_dir, ": cannot write ", rel);
      out << nlohmann::json{{"id", s.key}, {"image", rel}, {"text", s.text}}.dump() << "\n";
    }
    MEGATRON_CHECK(out.good(), "--output-dir ", output_dir, ": cannot write ", manifest.string());
    log_line(strprintf(" > wrote scenes %lld..%lld (seed %llu, %lld x %lld) to %s",
                       static_cast<long long>(first_index),
                       static_cast<long long>(first_index + num_samples - 1),
                       static_cast<unsigned long long>(seed), static_cast<long long>(img_size),
                       static_cast<long long>(img_size), manifest.string().c_str()));
    return 0;
  }
  int64_t shards = 0;
  for (int64_t begin = first_index; begin < first_index + num_samples; begin += per_shard) {
    std::vector<image::ImageTextSample> batch;
    for (int64_t i = begin; i < std::min(begin + per_shard, first_index + num_samples); ++i)
      batch.push_back(sample(i));
    char name[32];
    std::snprintf(name, sizeof name, "scenes-%06lld.tar", static_cast<long long>(shards++));
    image::write_webdataset((dir / name).string(), batch);
  }
  log_line(strprintf(
      " > wrote scenes %lld..%lld (seed %llu, %lld x %lld) as %lld WebDataset "
      "shard(s) in %s",
      static_cast<long long>(first_index), static_cast<long long>(first_index + num_samples - 1),
      static_cast<unsigned long long>(seed), static_cast<long long>(img_size),
      static_cast<long long>(img_size), static_cast<long long>(shards), output_dir.c_str()));
  return 0;
}

}  // namespace megatron::cli
