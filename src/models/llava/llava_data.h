// LLaVA's data: image-text samples (JSONL manifests or WebDataset shards, image/image_text_data.h)
// as SampleSources, and the micro-batches LlavaChunk reads.
//
// A sample is one image and its text, tokenized as LLaVA's pretraining and Megatron's
// pretrain_vlm lay it out: captions as [image] caption <eod>, conversations as prompt (with the
// image token where the prompt says "<image>", else first) answer <eod>; the loss is on the
// caption or the answer and its <eod> only. The text is cut or padded (pad id, loss 0) to
// --dataloader-seq-length tokens plus one; the image is decoded and resized by the CLIP transform
// (Pillow's bicubic) when the sample is read, and normalised in the batch.
//
// A batch of b samples holds tokens and position_ids [b, T] (T = --dataloader-seq-length), images
// [b, 3, img_h, img_w] f32, and labels and loss_mask [b, S] spliced as models/llava/image_splice
// places them in the combined sequence of S = the language model's length.
//
// Data flags: --data-path FILE... (manifests *.jsonl and shards *.tar, their samples in order)
// cut by --split into contiguous train/validation/test ranges, or --train-data-path,
// --valid-data-path and --test-data-path, one list per split. Each split's samples are read in a
// new order every epoch (a Fisher-Yates shuffle of Philox-free mt19937_64 draws seeded by --seed
// and the epoch), so a run's sample order is a pure function of the seed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/data_config.h"
#include "data/tokenizer.h"
#include "image/image_text_data.h"
#include "models/model_spec.h"

namespace megatron {

// One sample's text as token ids: the T + 1 ids (image token included) and the loss mask of the
// T labels (label j = id j + 1). `where` names the sample in errors.
struct LlavaText {
  std::vector<int64_t> ids;
  std::vector<float> loss_mask;
};
LlavaText llava_text(const image::ImageTextSample& sample, const Tokenizer& tokenizer,
                     int64_t text_seq_length);

class ImageTextDataset final : public SampleSource {
 public:
  // count: samples to serve (epochs over `samples` in shuffled order).
  ImageTextDataset(std::vector<image::ImageTextSample> samples, const Tokenizer& tokenizer,
                   const DataConfig& config, int64_t count, uint64_t seed);
  int64_t size() const override { return count_; }
  int64_t seq_length() const override { return text_; }
  // [T + 1 ids | T loss mask | img_h img_w 3 RGB bytes]
  int64_t sample_width() const override;
  void sample(int64_t index, int64_t* out) const override;

 private:
  std::vector<image::ImageTextSample> samples_;
  std::vector<LlavaText> texts_;
  std::vector<int64_t> order_;
  int64_t text_, img_h_, img_w_, count_;
};

Datasets llava_datasets(const DataConfig& config, const Tokenizer& tokenizer, int64_t seq_length,
                        const SampleCounts& counts, bool log);
BatchFn llava_batch_maker(const DataConfig& config, const Tokenizer& tokenizer);
// The micro-batch fields' specs (tokens/position_ids [b, T], images, labels/loss_mask [b, S]).
TensorSpec llava_batch_field(const std::string& name, int64_t b, const TransformerConfig& cfg);

}  // namespace megatron
