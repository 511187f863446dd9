// Where a LLaVA model's image embeddings go in the language model's input, and the labels and
// loss mask of the combined sequence: Megatron's LLaVAModel._preprocess_data, restated.
//
// Each image token (id image_token_index, Megatron's -200) in input_ids [b, s] stands for one
// image of t tiles; it is replaced by the image's t x img_seq_len embeddings. With the text token
// positions shifted accordingly, for sample b:
//   seq_len_b  = (sum of its images' tiles) img_seq_len - (its image tokens) + s
//   combined length = max over b (padded to language_max_seq_len for pipeline parallelism),
//     truncated to language_max_seq_len;
//   position of token i = sum over j <= i of (1, or t_j img_seq_len for an image token) - 1
//     (for an image token: its last embedding);
//   image_mask: every position that is not a text position and lies before the sample's end;
//     image embeddings fill it in order (sample by sample, image by image, tile by tile);
//   labels (shifted left by one, as the inputs' labels are): position(i) - 1 gets labels[i - 1]
//     for every text token i >= 1, position seq_len_b - 1 gets the last label, the rest -100;
//   loss mask: loss_mask[i] at each text token's position, 0 on images, on padding and on the
//     text token just before each image (it would predict an image embedding).
#pragma once

#include <cstdint>
#include <vector>

namespace megatron {

inline constexpr int64_t kImageTokenIndex = -200;  // Megatron's DEFAULT_IMAGE_TOKEN_INDEX
inline constexpr int64_t kIgnoreIndex = -100;

struct SpliceInput {
  int64_t batch = 0, text_len = 0;
  std::vector<int64_t> input_ids;        // [batch, text_len]
  std::vector<int64_t> labels;           // [batch, text_len], or empty (no labels)
  std::vector<float> loss_mask;          // [batch, text_len] with labels
  std::vector<int64_t> num_image_tiles;  // per image, in order of the image tokens
  int64_t img_seq_len = 0;               // embeddings per tile
  int64_t image_token_index = kImageTokenIndex;
  int64_t language_max_seq_len = 0;  // the language model's --seq-length
  bool pad_to_max = false;           // pipeline parallel: fixed length language_max_seq_len
};

struct SpliceLayout {
  int64_t full_len = 0;  // before truncation
  int64_t seq_len = 0;   // after: min(full_len, language_max_seq_len)
  // [batch, text_len]: each text token's position, -1 for image tokens (a position >= seq_len is
  // truncated away).
  std::vector<int64_t> text_position;
  std::vector<uint8_t> image_mask;  // [batch, full_len]
  std::vector<int64_t> labels;      // [batch, seq_len] (empty without labels)
  std::vector<float> loss_mask;     // [batch, seq_len]
};

// Errors (exit 2) when the image tokens and num_image_tiles disagree.
SpliceLayout splice_image_tokens(const SpliceInput& in);

}  // namespace megatron
