// Image-text samples in the formats users have, for vision-language training:
//   JSONL manifest: one JSON object per line, {"image": PATH, "text": CAPTION} (an "id" is
//     optional), or LLaVA's {"id", "image", "conversations": [{"from": "human", "value": PROMPT},
//     {"from": "gpt", "value": ANSWER}]}; PATH relative to the manifest's directory unless
//     absolute.
//   WebDataset tar shards (what Megatron's Energon reads): members KEY.EXT, grouped by KEY (the
//     member's path up to the first dot of its file name); the image in png, jpg or jpeg, the
//     text in txt (the caption) or json (an object with "caption" or "text", or the LLaVA
//     conversations list that Megatron's convert_llava_pretrain_to_wds.py writes).
// Tar files are read and written by libarchive. Errors name the manifest line or the shard and
// key, and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::image {

struct ImageTextSample {
  std::string key;             // the manifest's id (else its line number) or the WebDataset key
  std::string source;          // where the image is, for messages: a path, or "SHARD:KEY.EXT"
  std::string image_ext;       // "png", "jpg" or "jpeg" (what a shard member is named)
  std::vector<uint8_t> image;  // the encoded file (image/decode.h decodes it)
  std::string prompt;          // the human turn as written ("<image>" included); empty for captions
  std::string text;            // the caption, or the answer
};

// A manifest's samples in file order; with load_images the image files are read (a missing one
// is an error naming it and the manifest line), else only `source` is set.
std::vector<ImageTextSample> read_manifest(const std::string& path, bool load_images = true);
// A shard's samples in the order their first member appears.
std::vector<ImageTextSample> read_webdataset(const std::string& tar_path);
// Writes samples as a shard: KEY.EXT (the image) and KEY.txt (the text) per sample, or KEY.json
// ({"prompt", "text"}) when a sample has a prompt.
void write_webdataset(const std::string& tar_path, const std::vector<ImageTextSample>& samples);

}  // namespace megatron::image
