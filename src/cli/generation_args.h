// The text-generation flags of `megatron generate` and `megatron serve`, Megatron's
// add_text_generate_args with its defaults (greedy: --top_k 1), and the prompts' tokenization.
#pragma once

#include <string>
#include <vector>

#include "cli/arg_table.h"
#include "data/tokenizer.h"
#include "inference/generator.h"

namespace megatron::cli {

struct GenerationArgs {
  double temperature = 1.0;
  int64_t top_k = 1;
  double top_p = 0.0;
  bool return_log_probs = true;  // Megatron's store_true with default True
  int64_t num_tokens_to_generate = 30;
  int64_t inference_max_batch_size = 8;
  int64_t max_batch_size = 0;  // deprecated alias: the larger of the two applies
  int64_t seed = 1234;
};

void register_generation_args(ArgTable& t, GenerationArgs& g);
// The sampling settings of the flags (checked against the vocabulary; errors name the flag).
inference::SamplingParams sampling_of(const GenerationArgs& g, int64_t vocab_size);
// The batch size the flags ask for (--max-batch-size raises it, as Megatron's deprecation does).
int64_t max_batch_of(const GenerationArgs& g);

// A prompt's token ids: with add_bos the end-of-document id first (Megatron's add_BOS).
std::vector<int64_t> tokenize_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                     bool add_bos);
// Megatron's response fields of one result: "text" (prompt and generation detokenized),
// "tokens", "segments" (each token detokenized alone) and, when computed, "logprobs".
struct ResultText {
  std::string text;
  std::vector<std::string> segments;
};
ResultText detokenize(const Tokenizer& tokenizer, const inference::GenerationResult& r);

}  // namespace megatron::cli
