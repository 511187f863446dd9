// Image-text samples for LLaVA: tokenized texts, shuffled epochs, CLIP-resized images, spliced
// labels (see the header).
#include "models/llava/llava_data.h"

#include <algorithm>
#include <random>

#include "core/error.h"
#include "core/logging.h"
#include "data/gpt_batch.h"
#include "data/gpt_dataset.h"  // split_document_ranges
#include "image/clip_transform.h"
#include "image/decode.h"
#include "models/llava/image_splice.h"
#include "models/llava/llava_chunk.h"

namespace megatron {

namespace {

constexpr std::string_view kImageTag = "<image>";

std::string where(const image::ImageTextSample& s) {
  return s.source + " (" + s.key + ")";
}

std::vector<image::ImageTextSample> load(const std::vector<std::string>& paths) {
  std::vector<image::ImageTextSample> all;
  for (const std::string& p : paths) {
    const bool tar = p.size() > 4 && p.compare(p.size() - 4, 4, ".tar") == 0;
    MEGATRON_CHECK(tar || (p.size() > 6 && p.compare(p.size() - 6, 6, ".jsonl") == 0),
                   "image-text data path '", p,
                   "': expected a JSONL manifest (*.jsonl) or a WebDataset shard (*.tar); "
                   "blends with weights are not supported for image-text data");
    std::vector<image::ImageTextSample> part =
        tar ? image::read_webdataset(p) : image::read_manifest(p);
    for (auto& s : part) {
      s.key = p + " sample " + s.key;  // messages name the manifest or shard too
      all.push_back(std::move(s));
    }
  }
  return all;
}

// Epoch after epoch of `n` samples, each in its own shuffled order.
std::vector<int64_t> epoch_order(int64_t n, int64_t count, uint64_t seed) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(count));
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t epoch = 0; static_cast<int64_t>(order.size()) < count; ++epoch) {
    for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
    std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates with an unbiased draw of [0, i]
      const uint64_t bound = static_cast<uint64_t>(i) + 1;
      const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
      uint64_t r;
      do r = rng();
      while (r >= limit);
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(r % bound)]);
    }
    for (int64_t i = 0; i < n && static_cast<int64_t>(order.size()) < count; ++i)
      order.push_back(perm[static_cast<size_t>(i)]);
  }
  return order;
}

}  // namespace

LlavaText llava_text(const image::ImageTextSample& sample, const Tokenizer& tokenizer,
                     int64_t text_seq_length) {
  std::vector<int64_t> ids;
  std::vector<uint8_t> target;  // 1: trained as a label
  auto append = [&](std::string_view text, bool trained) {
    for (int64_t id : tokenizer.encode(text)) {
      ids.push_back(id);
      target.push_back(trained ? 1 : 0);
    }
  };
  auto image_token = [&]() {
    ids.push_back(kImageTokenIndex);
    target.push_back(0);
  };
  MEGATRON_CHECK(sample.text.find(kImageTag) == std::string::npos, where(sample),
                 ": the text has an image token \"<image>\" but each sample has one image, "
                 "placed before the caption or where the prompt says: remove it from the text");
  const size_t at = sample.prompt.find(kImageTag);
  MEGATRON_CHECK(at == std::string::npos ||
                     sample.prompt.find(kImageTag, at + kImageTag.size()) == std::string::npos,
                 where(sample),
                 ": more image tokens \"<image>\" in the prompt than images (one per sample)");
  if (at == std::string::npos) {
    image_token();  // LLaVA's pretraining and Megatron's pretrain_vlm: the image first
    append(sample.prompt, false);
  } else {
    append(std::string_view(sample.prompt).substr(0, at), false);
    image_token();
    append(std::string_view(sample.prompt).substr(at + kImageTag.size()), false);
  }
  const auto image_at =
      static_cast<int64_t>(std::find(ids.begin(), ids.end(), kImageTokenIndex) - ids.begin());
  MEGATRON_CHECK(image_at < text_seq_length, where(sample),
                 ": the prompt puts the image token "
                 "after ",
                 image_at, " tokens, beyond the ", text_seq_length,
                 " a sample holds (--dataloader-seq-length + 1): shorten the prompt or raise "
                 "--dataloader-seq-length");
  append(sample.text, true);
  ids.push_back(tokenizer.eod());
  target.push_back(1);
  const SpecialTokens special = tokenizer.special_tokens();
  const int64_t pad = special.pad >= 0 ? special.pad : tokenizer.eod();
  ids.resize(static_cast<size_t>(text_seq_length + 1), pad);  // cut or padded
  target.resize(static_cast<size_t>(text_seq_length + 1), 0);
  LlavaText t;
  t.ids = std::move(ids);
  t.loss_mask.resize(static_cast<size_t>(text_seq_length));
  for (int64_t j = 0; j < text_seq_length; ++j)
    t.loss_mask[static_cast<size_t>(j)] = target[static_cast<size_t>(j + 1)];
  return t;
}

ImageTextDataset::ImageTextDataset(std::vector<image::ImageTextSample> samples,
                                   const Tokenizer& tokenizer, const DataConfig& config,
                                   int64_t count, uint64_t seed)
    : samples_(std::move(samples)),
      text_(config.text_seq_length),
      img_h_(config.img_h),
      img_w_(config.img_w),
      count_(count) {
  MEGATRON_CHECK(!samples_.empty(), "image-text data: a split has no samples");
  MEGATRON_CHECK(text_ > 0 && img_h_ > 0 && img_w_ > 0,
                 "image-text data needs positive "
                 "--dataloader-seq-length (or --seq-length), --img-h and --img-w");
  texts_.reserve(samples_.size());
  for (const auto& s : samples_) texts_.push_back(llava_text(s, tokenizer, text_));
  order_ = epoch_order(static_cast<int64_t>(samples_.size()), count_, seed);
}

int64_t ImageTextDataset::sample_width() const {
  return 2 * text_ + 1 + img_h_ * img_w_ * 3;
}

void ImageTextDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < count_, "image-text sample ", index, " of ", count_);
  const size_t k = static_cast<size_t>(order_[static_cast<size_t>(index)]);
  const LlavaText& t = texts_[k];
  for (int64_t j = 0; j <= text_; ++j) *out++ = t.ids[static_cast<size_t>(j)];
  for (int64_t j = 0; j < text_; ++j) *out++ = t.loss_mask[static_cast<size_t>(j)] > 0 ? 1 : 0;
  const image::Image rgb =
      image::clip_resize(image::decode(samples_[k].image, samples_[k].source), img_h_, img_w_);
  for (uint8_t v : rgb.pixels) *out++ = v;
}

Datasets llava_datasets(const DataConfig& config, const Tokenizer& tokenizer,
                        int64_t /*seq_length*/, const SampleCounts& counts, bool log) {
  MEGATRON_CHECK(!config.mock_data,
                 "--mock-data makes GPT documents; a LLaVA model reads image-text data: pass "
                 "--data-path with JSONL manifests or WebDataset shards (`megatron scenes` "
                 "writes a checkable set)");
  std::array<std::vector<image::ImageTextSample>, 3> splits;
  if (!config.train_data_path.empty()) {
    splits[0] = load(config.train_data_path);
    splits[1] = load(config.valid_data_path);
    splits[2] = load(config.test_data_path);
  } else {
    MEGATRON_CHECK(!config.data_path.empty(),
                   "a LLaVA model needs image-text data: --data-path FILE... (JSONL manifests, "
                   "WebDataset .tar shards) or --train-data-path");
    std::vector<image::ImageTextSample> all = load(config.data_path);
    const auto ranges = split_document_ranges(config.split, static_cast<int64_t>(all.size()));
    for (size_t s = 0; s < 3; ++s) {
      if (!ranges[s]) continue;
      for (int64_t i = ranges[s]->begin; i < ranges[s]->end; ++i)
        splits[s].push_back(all[static_cast<size_t>(i)]);
    }
  }
  const std::array<int64_t, 3> need{counts.train, counts.valid, counts.test};
  const std::array<const char*, 3> names{"train", "validation", "test"};
  Datasets out;
  std::array<std::unique_ptr<SampleSource>*, 3> slots{&out.train, &out.valid, &out.test};
  for (size_t s = 0; s < 3; ++s) {
    if (log) {
      log_line(std::string(" > image-text ") + names[s] +
               " split: " + std::to_string(splits[s].size()) + " samples");
    }
    if (splits[s].empty() || need[s] <= 0) continue;
    *slots[s] = std::make_unique<ImageTextDataset>(std::move(splits[s]), tokenizer, config, need[s],
                                                   static_cast<uint64_t>(config.seed) + s);
  }
  MEGATRON_CHECK(out.train != nullptr || counts.train <= 0,
                 "image-text data: the train split is empty (check --split and --data-path)");
  return out;
}

BatchFn llava_batch_maker(const DataConfig& config, const Tokenizer& /*tokenizer*/) {
  return [config](const SampleSource& data, int64_t first, int64_t b) {
    const int64_t text = config.text_seq_length, h = config.img_h, w = config.img_w;
    const int64_t seq = config.language_seq_length;
    MEGATRON_CHECK(data.sample_width() == 2 * text + 1 + h * w * 3,
                   "LLaVA batches need image-text samples");
    Tensor tokens = Tensor::empty({b, text}, DType::kI64);
    Tensor positions = Tensor::empty({b, text}, DType::kI64);
    Tensor images = Tensor::empty({b, 3, h, w}, DType::kF32);
    SpliceInput in;
    in.batch = b;
    in.text_len = text;
    in.img_seq_len = config.image_embeddings;
    in.language_max_seq_len = seq;
    in.pad_to_max = true;
    in.num_image_tiles.assign(static_cast<size_t>(b), 1);
    std::vector<int64_t> record(static_cast<size_t>(data.sample_width()));
    std::vector<uint8_t> rgb(static_cast<size_t>(h * w * 3));
    for (int64_t i = 0; i < b; ++i) {
      data.sample(first + i, record.data());
      const int64_t* r = record.data();
      for (int64_t j = 0; j < text; ++j) {
        tokens.data<int64_t>()[i * text + j] = r[j];
        positions.data<int64_t>()[i * text + j] = j;
        in.input_ids.push_back(r[j]);
        in.labels.push_back(r[j + 1]);
        in.loss_mask.push_back(static_cast<float>(r[text + 1 + j]));
      }
      for (size_t k = 0; k < rgb.size(); ++k)
        rgb[k] = static_cast<uint8_t>(r[2 * text + 1 + static_cast<int64_t>(k)]);
      image::clip_normalize(rgb.data(), h, w, images.data<float>() + i * 3 * h * w);
    }
    const SpliceLayout layout = splice_image_tokens(in);
    Tensor labels = Tensor::empty({b, seq}, DType::kI64);
    Tensor loss_mask = Tensor::empty({b, seq}, DType::kF32);
    for (int64_t k = 0; k < b * seq; ++k) {
      // Ignored positions (-100) carry loss mask 0; the head reads label 0 there.
      const int64_t label = layout.labels[static_cast<size_t>(k)];
      labels.data<int64_t>()[k] = label < 0 ? 0 : label;
      loss_mask.data<float>()[k] = layout.loss_mask[static_cast<size_t>(k)];
    }
    return TensorMap{{kTokens, tokens},
                     {kPositionIds, positions},
                     {kImages, images},
                     {kLabels, labels},
                     {kLossMask, loss_mask}};
  };
}

TensorSpec llava_batch_field(const std::string& name, int64_t b, const TransformerConfig& cfg) {
  const VisionConfig& v = cfg.vision;
  if (name == kImages) return TensorSpec{name, Shape{b, 3, v.img_h, v.img_w}, DType::kF32};
  if (name == kTokens || name == kPositionIds)
    return TensorSpec{name, Shape{b, v.text_seq_length}, DType::kI64};
  if (name == kLabels) return TensorSpec{name, Shape{b, cfg.seq_length}, DType::kI64};
  MEGATRON_CHECK(name == kLossMask, "LLaVA batches have no field '", name, "'");
  return TensorSpec{name, Shape{b, cfg.seq_length}, DType::kF32};
}

}  // namespace megatron
