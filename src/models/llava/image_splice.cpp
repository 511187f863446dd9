// Megatron's LLaVA input arithmetic (models/llava/image_splice.h).
#include "models/llava/image_splice.h"

#include <algorithm>

#include "core/error.h"

namespace megatron {

SpliceLayout splice_image_tokens(const SpliceInput& in) {
  const int64_t b = in.batch, s = in.text_len;
  MEGATRON_CHECK(b > 0 && s > 0 && static_cast<int64_t>(in.input_ids.size()) == b * s,
                 "image splice: input_ids must be [batch, text_len] = [", b, ", ", s, "]");
  MEGATRON_CHECK(in.img_seq_len > 0 && in.language_max_seq_len > 0,
                 "image splice: img_seq_len and the language model's sequence length must be "
                 "positive");
  const bool has_labels = !in.labels.empty();
  MEGATRON_CHECK(!has_labels || (static_cast<int64_t>(in.labels.size()) == b * s &&
                                 static_cast<int64_t>(in.loss_mask.size()) == b * s),
                 "image splice: labels and loss_mask must be [batch, text_len] like input_ids");
  int64_t images = 0;
  for (int64_t id : in.input_ids) images += id == in.image_token_index;
  MEGATRON_CHECK(images == static_cast<int64_t>(in.num_image_tiles.size()), "the batch has ",
                 images, " image token(s) (id ", in.image_token_index, ") but ",
                 in.num_image_tiles.size(),
                 " image(s): each image token stands for exactly one image");
  for (int64_t t : in.num_image_tiles)
    MEGATRON_CHECK(t > 0, "image splice: an image with ", t, " tiles");

  SpliceLayout out;
  out.text_position.assign(static_cast<size_t>(b * s), -1);
  std::vector<int64_t> new_pos(static_cast<size_t>(b * s)), seq_lens(static_cast<size_t>(b));
  size_t image = 0;
  for (int64_t r = 0; r < b; ++r) {
    int64_t pos = -1;
    for (int64_t i = 0; i < s; ++i) {
      const size_t k = static_cast<size_t>(r * s + i);
      const bool is_image = in.input_ids[k] == in.image_token_index;
      pos += is_image ? in.num_image_tiles[image++] * in.img_seq_len : 1;
      new_pos[k] = pos;
      if (!is_image) out.text_position[k] = pos;
    }
    seq_lens[static_cast<size_t>(r)] = pos + 1;
  }
  int64_t full = *std::max_element(seq_lens.begin(), seq_lens.end());
  if (in.pad_to_max) full = std::max(full, in.language_max_seq_len);
  out.full_len = full;
  out.seq_len = std::min(full, in.language_max_seq_len);

  out.image_mask.assign(static_cast<size_t>(b * full), 1);
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t i = 0; i < s; ++i) {
      const int64_t p = out.text_position[static_cast<size_t>(r * s + i)];
      if (p >= 0) out.image_mask[static_cast<size_t>(r * full + p)] = 0;
    }
    for (int64_t p = seq_lens[static_cast<size_t>(r)]; p < full; ++p)
      out.image_mask[static_cast<size_t>(r * full + p)] = 0;  // padding
  }
  if (!has_labels) return out;

  // Labels and loss mask over the full length first, truncated at the end (as Megatron does).
  std::vector<int64_t> labels(static_cast<size_t>(b * full), kIgnoreIndex);
  std::vector<float> mask(static_cast<size_t>(b * full), 0.0f);
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t i = 0; i < s; ++i) {
      const size_t k = static_cast<size_t>(r * s + i);
      const int64_t p = out.text_position[k];
      if (p < 0) continue;
      mask[static_cast<size_t>(r * full + p)] = in.loss_mask[k];
      if (i >= 1 && p >= 1) labels[static_cast<size_t>(r * full + p - 1)] = in.labels[k - 1];
    }
    labels[static_cast<size_t>(r * full + seq_lens[static_cast<size_t>(r)] - 1)] =
        in.labels[static_cast<size_t>(r * s + s - 1)];
    for (int64_t p = 0; p < full; ++p)
      if (out.image_mask[static_cast<size_t>(r * full + p)])
        mask[static_cast<size_t>(r * full + p)] = 0;
    // The text token just before an image would predict an image embedding.
    for (int64_t i = 1; i < s; ++i) {
      if (in.input_ids[static_cast<size_t>(r * s + i)] == in.image_token_index)
        mask[static_cast<size_t>(r * full + new_pos[static_cast<size_t>(r * s + i - 1)])] = 0;
    }
  }
  out.labels.resize(static_cast<size_t>(b * out.seq_len));
  out.loss_mask.resize(static_cast<size_t>(b * out.seq_len));
  for (int64_t r = 0; r < b; ++r) {
    std::copy_n(labels.begin() + r * full, out.seq_len, out.labels.begin() + r * out.seq_len);
    std::copy_n(mask.begin() + r * full, out.seq_len, out.loss_mask.begin() + r * out.seq_len);
  }
  return out;
}

}  // namespace megatron
