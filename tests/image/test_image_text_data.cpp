// The scenes task, PNG encoding, and image-text samples in JSONL manifests and WebDataset shards:
// round trips, the LLaVA conversation form, and errors that name the line, shard or sample.
#include <gtest/gtest.h>

#include <unistd.h>
#include <array>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "image/decode.h"
#include "image/encode.h"
#include "image/image_text_data.h"
#include "image/scenes.h"

namespace megatron::image {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("image_text_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Scenes, CaptionsNameWhatIsDrawn) {
  std::map<std::string, int> seen;
  for (int64_t i = 0; i < 3000; ++i) {
    const Scene s = scene_at(7, i);
    const Scene again = scene_at(7, i);
    ASSERT_EQ(scene_caption(s), scene_caption(again));
    ++seen[kSceneShapes[s.shape]];
    ++seen[kSceneColours[s.colour]];
    ++seen[kSceneSizes[s.size]];
    ++seen[kScenePlaces[s.place]];
  }
  // Each attribute value about equally often (3000 / n each; 25% allows for sampling noise,
  // about 4 standard deviations at the rarest n).
  for (const auto& values : {std::vector<const char*>(kSceneShapes.begin(), kSceneShapes.end()),
                             std::vector<const char*>(kSceneColours.begin(), kSceneColours.end()),
                             std::vector<const char*>(kSceneSizes.begin(), kSceneSizes.end()),
                             std::vector<const char*>(kScenePlaces.begin(), kScenePlaces.end())}) {
    for (const char* v : values) {
      const double want = 3000.0 / static_cast<double>(values.size());
      EXPECT_NEAR(seen[v], want, 0.25 * want) << v;
    }
  }
  Scene s;
  s.shape = 2;
  s.colour = 0;
  s.size = 1;
  s.place = 4;
  EXPECT_EQ(scene_caption(s), "a large red triangle in the center");
  s.place = 1;
  s.size = 0;
  s.shape = 0;
  s.colour = 2;
  EXPECT_EQ(scene_caption(s), "a small blue circle at the top right");
  // Drawn where the caption says: the centre of a large blue circle at the top right is blue,
  // the opposite corner is background.
  s.size = 1;
  const Image img = render_scene(s, 64);
  EXPECT_GT(img.at(17, 46, 2), 150);
  EXPECT_LT(img.at(17, 46, 0), 60);
  EXPECT_EQ(img.at(60, 3, 0), img.at(60, 3, 2));  // gray background
  EXPECT_THROW(render_scene(s, 8), InvalidArgument);
}

TEST(ImageEncode, PngRoundTripsExactly) {
  const Image img = render_scene(scene_at(3, 5), 40);
  const Image back = decode(encode_png(img), "round trip");
  EXPECT_EQ(back.mode, Mode::kRGB);
  EXPECT_EQ(back.width, 40);
  EXPECT_EQ(back.pixels, img.pixels);
}

TEST(ImageTextData, WebDatasetRoundTripAndErrors) {
  const auto dir = temp_dir("wds");
  std::vector<ImageTextSample> samples;
  for (int i = 0; i < 3; ++i) {
    ImageTextSample s;
    s.key = "s" + std::to_string(i);
    s.image_ext = "png";
    s.image = encode_png(render_scene(scene_at(1, i), 24));
    s.text = scene_caption(scene_at(1, i));
    if (i == 2) s.prompt = "<image>\nWhat is shown?";
    samples.push_back(s);
  }
  const std::string tar = (dir / "shard.tar").string();
  write_webdataset(tar, samples);
  const std::vector<ImageTextSample> back = read_webdataset(tar);
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back[i].key, samples[i].key);
    EXPECT_EQ(back[i].image, samples[i].image);
    EXPECT_EQ(back[i].text, samples[i].text);
    EXPECT_EQ(back[i].prompt, samples[i].prompt);
    EXPECT_EQ(back[i].source, tar + ":" + samples[i].key + ".png");
  }
  // A file that is not a tar; an image that is neither PNG nor JPEG.
  write_text(dir / "bad.tar", "not a tar file at all");
  EXPECT_NE(error_of([&] { read_webdataset((dir / "bad.tar").string()); }).find("bad.tar"),
            std::string::npos);
  samples[0].image_ext = "gif";
  EXPECT_NE(error_of([&] { write_webdataset((dir / "gif.tar").string(), samples); }).find("gif"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ImageTextData, ManifestCaptionsConversationsAndErrors) {
  const auto dir = temp_dir("jsonl");
  std::filesystem::create_directories(dir / "img");
  const std::vector<uint8_t> png = encode_png(render_scene(scene_at(2, 0), 20));
  std::ofstream(dir / "img" / "a.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  write_text(dir / "m.jsonl",
             "{\"id\": \"a\", \"image\": \"img/a.png\", \"text\": \"a small red circle\"}\n\n"
             "{\"image\": \"img/a.png\", \"conversations\": [{\"from\": \"human\", \"value\": "
             "\"<image>\\nDescribe.\"}, {\"from\": \"gpt\", \"value\": \"a circle\"}]}\n");
  const std::vector<ImageTextSample> m = read_manifest((dir / "m.jsonl").string());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].key, "a");
  EXPECT_EQ(m[0].image, png);
  EXPECT_EQ(m[0].text, "a small red circle");
  EXPECT_EQ(m[1].key, "3");  // its line number
  EXPECT_EQ(m[1].prompt, "<image>\nDescribe.");
  EXPECT_EQ(m[1].text, "a circle");
  // A missing image names the manifest line and the image; bad JSON names the line.
  write_text(dir / "missing.jsonl", "{\"image\": \"img/b.png\", \"text\": \"x\"}\n");
  const std::string missing = error_of([&] { read_manifest((dir / "missing.jsonl").string()); });
  EXPECT_NE(missing.find("missing.jsonl:1"), std::string::npos) << missing;
  EXPECT_NE(missing.find("img/b.png"), std::string::npos) << missing;
  write_text(dir / "broken.jsonl", "{\"image\": \"img/a.png\", \"text\": \"x\"}\n{oops\n");
  EXPECT_NE(
      error_of([&] { read_manifest((dir / "broken.jsonl").string()); }).find("broken.jsonl:2"),
      std::string::npos);
  write_text(dir / "notext.jsonl", "{\"image\": \"img/a.png\"}\n");
  EXPECT_NE(error_of([&] { read_manifest((dir / "notext.jsonl").string()); }).find("\"text\""),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megatron::image
