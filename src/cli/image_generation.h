// `megatron generate` for a vision-language model (--model llava): prompts that carry an image.
//
// Each prompt is text where "<image>" marks the image's place (none: the image comes first, as
// LLaVA's pretraining lays captions out) and an image file, decoded and resized by the CLIP
// transform the model trained with. Tokens are generated one at a time (sampled as `megatron
// generate` samples: Philox(seed, prompt index, position), --top_k 1 greedy) until
// --num-tokens-to-generate or the end-of-document token, the prompt and image once through the
// KV cache and then a token per step; one prompt at a time, one pipeline stage, any TP. Rank 0
// prints
// one JSON line per prompt: "prompt", "image", "text" (the prompt's text and the generation),
// "generated_text", "tokens" (the prompt's ids with the image token -200, then the generated
// ids) and, with --return-log-probs, "logprobs" of the generated tokens.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/generation_args.h"
#include "cli/mpi_command.h"
#include "train/arguments.h"

namespace megatron::cli {

struct ImagePrompt {
  std::string prompt;
  std::string image;  // a JPEG or PNG file
};

// --prompt-file lines {"prompt": TEXT, "image": PATH} (paths relative to the file's directory),
// or --prompts with --images, one image per prompt. Errors name the flag or file:line.
std::vector<ImagePrompt> image_prompts(const std::vector<std::string>& prompts,
                                       const std::vector<std::string>& images,
                                       const std::string& prompt_file);

int run_image_generation(const Arguments& args, const GenerationArgs& gen,
                         const std::vector<ImagePrompt>& prompts, MpiRuntime& mpi);

// `megatron score --model llava`: one input line {"image": PATH, "tokens": [ids]} (the image
// token -200 where the image goes; PATH relative to the input's directory) scored by a whole
// LLaVA model: {"logprobs": [log p(token t+1 | tokens <= t, image)] for every text token after
// the first (null where the next token is the image itself), "loss": their mean negative}.
// `where` (FILE:LINE) names the line in errors.
nlohmann::json score_image_line(const ModelChunk& model, const TransformerConfig& cfg,
                                const std::string& line, const std::string& where,
                                const std::string& dir);

}  // namespace megatron::cli
