// Generation from image prompts (image_generation.h).
#include "cli/image_generation.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>

#include <nlohmann/json.hpp>

#include "cli/inference_model.h"
#include "core/error.h"
#include "core/philox.h"
#include "data/gpt_batch.h"  // the batch field names
#include "image/clip_transform.h"
#include "image/decode.h"
#include "inference/sampling.h"
#include "models/llava/image_splice.h"
#include "models/llava/llava_chunk.h"

namespace megatron::cli {

namespace {

constexpr std::string_view kImageTag = "<image>";

// The prompt's ids with the image token where "<image>" stands (first when it does not).
std::vector<int64_t> tokenize(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int64_t> ids;
  auto add = [&](std::string_view text) {
    for (int64_t id : tokenizer.encode(text)) ids.push_back(id);
  };
  const size_t at = prompt.find(kImageTag);
  MEGATRON_CHECK(
      at == std::string::npos || prompt.find(kImageTag, at + kImageTag.size()) == std::string::npos,
      "prompt '", prompt, "': more image tokens \"<image>\" than images (one each)");
  if (at == std::string::npos) {
    ids.push_back(kImageTokenIndex);
    add(prompt);
  } else {
    add(std::string_view(prompt).substr(0, at));
    ids.push_back(kImageTokenIndex);
    add(std::string_view(prompt).substr(at + kImageTag.size()));
  }
  return ids;
}

// log p(token) under the raw logits of one row over the first `vocab` entries (the output layer's
// padding rows excluded), in double.
double log_prob(const float* row, int64_t vocab, int64_t token) {
  double max = -INFINITY, sum = 0;
  for (int64_t k = 0; k < vocab; ++k) max = std::max(max, static_cast<double>(row[k]));
  for (int64_t k = 0; k < vocab; ++k) sum += std::exp(static_cast<double>(row[k]) - max);
  return static_cast<double>(row[token]) - max - std::log(sum);
}

// The text of ids, the image token left out.
std::string text_of(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int64_t> text;
  for (int64_t id : ids)
    if (id != kImageTokenIndex) text.push_back(id);
  return tokenizer.decode(text);
}

}  // namespace

std::vector<ImagePrompt> image_prompts(const std::vector<std::string>& prompts,
                                       const std::vector<std::string>& images,
                                       const std::string& prompt_file) {
  std::vector<ImagePrompt> out;
  if (prompt_file.empty()) {
    MEGATRON_CHECK(images.size() == prompts.size(),
                   "--model llava: give one image per prompt "
                   "(--images), got ",
                   images.size(), " for ", prompts.size(), " prompt(s)");
    for (size_t i = 0; i < prompts.size(); ++i) out.push_back({prompts[i], images[i]});
    return out;
  }
  MEGATRON_CHECK(images.empty(),
                 "--images goes with --prompts; a --prompt-file line names its "
                 "own \"image\"");
  std::ifstream in(prompt_file);
  MEGATRON_CHECK(in.good(), "--prompt-file: cannot open '", prompt_file, "'");
  const std::filesystem::path dir = std::filesystem::path(prompt_file).parent_path();
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MEGATRON_CHECK(false, prompt_file, ":", lineno, ": not valid JSON (", e.what(), ")");
    }
    MEGATRON_CHECK(j.is_object() && j.contains("image") && j["image"].is_string(), prompt_file, ":",
                   lineno, ": a line needs {\"prompt\": TEXT, \"image\": PATH}");
    std::filesystem::path image = j["image"].get<std::string>();
    if (image.is_relative()) image = dir / image;
    out.push_back({j.value("prompt", std::string()), image.string()});
  }
  MEGATRON_CHECK(!out.empty(), "--prompt-file ", prompt_file, " holds no prompt");
  return out;
}

int run_image_generation(const Arguments& args, const GenerationArgs& gen,
                         const std::vector<ImagePrompt>& prompts, MpiRuntime& mpi) {
  InferenceModel m = load_inference_model(args, mpi, false);
  const auto* chunk = dynamic_cast<const LlavaChunk*>(m.chunk.get());
  MEGATRON_CHECK(chunk != nullptr, "--model ", args.model, " takes no images");
  const Tokenizer& tok = *m.tokenizer;
  const VisionConfig& v = m.config.vision;
  const inference::SamplingParams sampling = sampling_of(gen, tok.vocab_size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int64_t> ids = tokenize(tok, prompts[p].prompt);
    const Tensor pixels = image::clip_pixels(image::read_file(prompts[p].image), v.img_h, v.img_w);
    const Tensor images = pixels.view({1, 3, v.img_h, v.img_w});
    const size_t prompt_len = ids.size();
    std::vector<float> logprobs;
    // The prompt with its image once (prefill), then one token per step through the KV cache.
    const int64_t positions_needed = static_cast<int64_t>(ids.size()) - 1 +
                                     v.num_image_embeddings() + gen.num_tokens_to_generate;
    MEGATRON_CHECK(positions_needed <= gen.inference_max_seq_length, "prompt ", p, " with its ",
                   v.num_image_embeddings(), " image embeddings and ", gen.num_tokens_to_generate,
                   " tokens to generate needs ", positions_needed,
                   " positions: more than --inference-max-seq-length ",
                   gen.inference_max_seq_length, " allows");
    KvCache cache(positions_needed);
    for (int64_t step = 0; step < gen.num_tokens_to_generate; ++step) {
      const bool prefill = step == 0;
      const auto n = static_cast<int64_t>(prefill ? ids.size() : 1);
      Tensor tokens = Tensor::empty({1, n}, DType::kI64);
      std::copy(ids.end() - n, ids.end(), tokens.data<int64_t>());
      // Text positions (learned position embeddings read them): the token's index.
      Tensor text_pos = Tensor::full({1, 1}, static_cast<double>(ids.size() - 1), DType::kI64);
      int64_t ran = 0;
      const LlavaInputs in{tokens, prefill ? Tensor() : text_pos, prefill ? images : Tensor(),
                           Tensor()};
      const Tensor logits =
          to_host(chunk->model().infer(in, /*last_only=*/true, &cache, &ran).to(DType::kF32));
      cache.advance(ran);
      const std::span<const float> row(logits.data<float>(), static_cast<size_t>(logits.dim(1)));
      const double u = Philox::uniform(static_cast<uint64_t>(gen.seed), p, ids.size() - 1);
      const int64_t next = inference::sample_token(row, sampling, tok.vocab_size(), u);
      if (gen.return_log_probs)
        logprobs.push_back(static_cast<float>(log_prob(row.data(), tok.vocab_size(), next)));
      ids.push_back(next);
      if (next == tok.eod()) break;
    }
    if (mpi.rank() != 0) continue;
    std::vector<int64_t> generated(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len),
                                   ids.end());
    if (!generated.empty() && generated.back() == tok.eod()) generated.pop_back();
    nlohmann::json line = {{"prompt", prompts[p].prompt},
                           {"image", prompts[p].image},
                           {"text", text_of(tok, ids)},
                           {"generated_text", tok.decode(generated)},
                           {"tokens", ids}};
    if (gen.return_log_probs) line["logprobs"] = logprobs;
    std::puts(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  }
  return 0;
}

nlohmann::json score_image_line(const ModelChunk& model, const TransformerConfig& cfg,
                                const std::string& line, const std::string& where,
                                const std::string& dir) {
  const auto* chunk = dynamic_cast<const LlavaChunk*>(&model);
  MEGATRON_CHECK(chunk != nullptr, "scoring with images needs --model llava");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, where, ": not valid JSON (", e.what(), ")");
  }
  MEGATRON_CHECK(j.is_object() && j.contains("image") && j["image"].is_string() &&
                     j.contains("tokens") && j["tokens"].is_array(),
                 where, ": a line needs {\"image\": PATH, \"tokens\": [ids]}");
  std::vector<int64_t> ids;
  int64_t images = 0;
  for (const auto& t : j["tokens"]) {
    MEGATRON_CHECK(t.is_number_integer(), where, ": tokens must be integer ids");
    const auto v = t.get<int64_t>();
    MEGATRON_CHECK(v == kImageTokenIndex || (v >= 0 && v < cfg.vocab_size), where, ": token id ", v,
                   " is outside the vocabulary [0, ", cfg.vocab_size,
                   ") (the image: ", kImageTokenIndex, ")");
    images += v == kImageTokenIndex;
    ids.push_back(v);
  }
  MEGATRON_CHECK(images == 1, where, ": ", images, " image tokens (", kImageTokenIndex,
                 ") for one image");
  std::filesystem::path image = j["image"].get<std::string>();
  if (image.is_relative()) image = std::filesystem::path(dir) / image;
  const VisionConfig& v = cfg.vision;
  const Tensor pixels = image::clip_pixels(image::read_file(image.string()), v.img_h, v.img_w);
  const auto n = static_cast<int64_t>(ids.size());
  Tensor tokens = Tensor::empty({1, n}, DType::kI64);
  std::copy(ids.begin(), ids.end(), tokens.data<int64_t>());
  const Tensor logits = to_host(
      chunk
          ->infer({},
                  TensorMap{{kTokens, tokens}, {kImages, pixels.view({1, 3, v.img_h, v.img_w})}},
                  ForwardMode{}, false)
          .at("logits")
          .to(DType::kF32));  // [n, Vp]
  nlohmann::json out;
  out["logprobs"] = nlohmann::json::array();
  double total = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const int64_t next = ids[static_cast<size_t>(t) + 1];
    if (next == kImageTokenIndex) {
      out["logprobs"].push_back(nullptr);
      continue;
    }
    const double lp = log_prob(logits.data<float>() + t * logits.dim(1), cfg.vocab_size, next);
    out["logprobs"].push_back(lp);
    total -= lp;
    ++counted;
  }
  out["loss"] = counted > 0 ? nlohmann::json(total / static_cast<double>(counted)) : nullptr;
  return out;
}

}  // namespace megatron::cli
