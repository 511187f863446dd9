// LLaVA's samples and batches (models/llava/llava_data.h): the token layout of captions and
// prompts, the refusals, and a batch's fields against their definitions: the image normalised as
// the CLIP transform does, labels and loss mask as the splice places them.
#include <gtest/gtest.h>

#include "data/gpt_batch.h"  // the batch field names
#include "data/null_tokenizer.h"
#include "image/clip_transform.h"
#include "image/decode.h"
#include "image/encode.h"
#include "image/scenes.h"
#include "models/llava/image_splice.h"
#include "models/llava/llava_chunk.h"
#include "models/llava/llava_data.h"

namespace megatron {
namespace {

const NullTokenizer kTokenizer(50);  // eod 49; no pad id, so padding is eod too

image::ImageTextSample sample(const std::string& prompt, const std::string& text, int64_t i = 0) {
  image::ImageTextSample s;
  s.key = "sample " + std::to_string(i);
  s.source = "scene" + std::to_string(i) + ".png";
  s.image_ext = "png";
  s.image = image::encode_png(image::render_scene(image::scene_at(1, i), 24));
  s.prompt = prompt;
  s.text = text;
  return s;
}

TEST(LlavaData, CaptionsPutTheImageFirstAndTrainOnTheCaption) {
  const LlavaText t = llava_text(sample("", "3 4 5"), kTokenizer, 7);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{kImageTokenIndex, 3, 4, 5, 49, 49, 49, 49}));
  // label j = id j + 1: the caption and its end token are trained, the padding not.
  EXPECT_EQ(t.loss_mask, (std::vector<float>{1, 1, 1, 1, 0, 0, 0}));
}

TEST(LlavaData, PromptsPlaceTheImageWhereTheySay) {
  const LlavaText t = llava_text(sample("7 <image> 8", "9"), kTokenizer, 5);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{7, kImageTokenIndex, 8, 9, 49, 49}));
  EXPECT_EQ(t.loss_mask, (std::vector<float>{0, 0, 1, 1, 0}));  // the answer and its end only
  const LlavaText cut = llava_text(sample("", "1 2 3 4 5 6"), kTokenizer, 3);
  EXPECT_EQ(cut.ids, (std::vector<int64_t>{kImageTokenIndex, 1, 2, 3}));
}

TEST(LlavaData, RefusalsNameTheSample) {
  auto refused = [](const image::ImageTextSample& s, int64_t len, const std::string& words) {
    try {
      llava_text(s, kTokenizer, len);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("scene0.png"), std::string::npos) << e.what();
    }
  };
  refused(sample("<image> 1 <image>", "2"), 8, "more image tokens");
  refused(sample("1", "2 <image>"), 8, "image token");
  refused(sample("1 2 3 4 <image>", "5"), 3, "--dataloader-seq-length");
}

TEST(LlavaData, BatchHoldsNormalisedImagesAndSplicedLabels) {
  DataConfig config;
  config.img_h = 16;
  config.img_w = 16;
  config.text_seq_length = 6;
  config.image_embeddings = 4;
  config.language_seq_length = 9;  // 6 - 1 + 4
  std::vector<image::ImageTextSample> samples{sample("", "1 2 3", 0), sample("5 <image>", "6", 1)};
  ImageTextDataset data(samples, kTokenizer, config, 2, 1);
  const TensorMap batch = llava_batch_maker(config, kTokenizer)(data, 0, 2);
  const Tensor tokens = batch.at(kTokens), images = batch.at(kImages);
  ASSERT_EQ(tokens.shape(), (Shape{2, 6}));
  ASSERT_EQ(images.shape(), (Shape{2, 3, 16, 16}));
  ASSERT_EQ(batch.at(kLabels).shape(), (Shape{2, 9}));
  for (int64_t i = 0; i < 2; ++i) {
    // Which sample came first is the epoch's shuffle: recognise it by its tokens.
    const bool caption = tokens.data<int64_t>()[i * 6] == kImageTokenIndex;
    const image::ImageTextSample& s = samples[caption ? 0 : 1];
    const Tensor want = image::clip_pixels(image::decode(s.image, s.source), 16, 16);
    for (int64_t k = 0; k < want.numel(); ++k)
      ASSERT_EQ(images.data<float>()[i * want.numel() + k], want.data<float>()[k]);
    const LlavaText t = llava_text(s, kTokenizer, 6);
    SpliceInput in;
    in.batch = 1;
    in.text_len = 6;
    in.input_ids.assign(t.ids.begin(), t.ids.begin() + 6);
    in.labels.assign(t.ids.begin() + 1, t.ids.end());
    in.loss_mask = t.loss_mask;
    in.num_image_tiles = {1};
    in.img_seq_len = 4;
    in.language_max_seq_len = 9;
    in.pad_to_max = true;
    const SpliceLayout layout = splice_image_tokens(in);
    for (int64_t p = 0; p < 9; ++p) {
      EXPECT_EQ(batch.at(kLabels).data<int64_t>()[i * 9 + p],
                std::max<int64_t>(layout.labels[static_cast<size_t>(p)], 0));
      EXPECT_EQ(batch.at(kLossMask).data<float>()[i * 9 + p],
                layout.loss_mask[static_cast<size_t>(p)]);
    }
  }
}

}  // namespace
}  // namespace megatron
