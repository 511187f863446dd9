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
  // Prompts per batch: Megatron's --inference-max-requests (r0.14), or its earlier name
  // --inference-max-batch-size; the deprecated --max-batch-size raises it. resolve_generation_args
  // leaves the result in inference_max_requests.
  int64_t inference_max_requests = 8;
  int64_t inference_max_batch_size = 8;
  int64_t max_batch_size = 0;
  // Longest prompt plus tokens to generate (Megatron's static inference context, default 2560);
  // the model's positions bound it too.
  int64_t inference_max_seq_length = 2560;
  int64_t seed = 1234;
};

void register_generation_args(ArgTable& t, GenerationArgs& g);
// After parsing: the batch size from whichever of its flags was given (both, with different
// values: an error naming them), the limits checked (InvalidArgument naming the flag).
void resolve_generation_args(GenerationArgs& g, const ArgTable& t);
// The sampling settings of the flags (checked against the vocabulary; errors name the flag).
inference::SamplingParams sampling_of(const GenerationArgs& g, int64_t vocab_size);
// The batch size the flags ask for (after resolve_generation_args).
int64_t max_batch_of(const GenerationArgs& g);
// The generator's limits: the vocabulary, end-of-document id, the model's positions and the
// flags' batch size and sequence length.
inference::GeneratorConfig generator_config(const GenerationArgs& g, const Tokenizer& tokenizer,
                                            int64_t max_position_embeddings);

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
