// The text-generation flags and prompt handling (generation_args.h).
#include "cli/generation_args.h"

#include <algorithm>

namespace megatron::cli {

void register_generation_args(ArgTable& t, GenerationArgs& g) {
  t.concern("text generation");
  t.add("--temperature", g.temperature, "Sampling temperature");
  t.add("--top_k", g.top_k, "Top-k sampling (1: greedy; 0: off)");
  t.add("--top_p", g.top_p, "Top-p sampling (0: off; not with --top_k > 1)");
  t.flag("--return-log-probs", g.return_log_probs,
         "Return the log probabilities of the output tokens (always on, as in Megatron)");
  t.add("--num-tokens-to-generate", g.num_tokens_to_generate,
        "Number of tokens to generate for each prompt");
  t.add("--inference-max-batch-size", g.inference_max_batch_size,
        "Prompts generated together in one batch");
  t.add("--max-batch-size", g.max_batch_size,
        "Deprecated in favor of --inference-max-batch-size (the larger applies)");
  t.add("--seed", g.seed, "Random seed of the sampling");
}

inference::SamplingParams sampling_of(const GenerationArgs& g, int64_t vocab_size) {
  inference::SamplingParams p{static_cast<float>(g.temperature), g.top_k,
                              static_cast<float>(g.top_p)};
  inference::check_sampling(p, vocab_size);
  return p;
}

int64_t max_batch_of(const GenerationArgs& g) {
  const int64_t n = std::max(g.inference_max_batch_size, g.max_batch_size);
  MEGATRON_CHECK(n >= 1, "--inference-max-batch-size must be >= 1, got ", n);
  return n;
}

std::vector<int64_t> tokenize_prompt(const Tokenizer& tokenizer, const std::string& prompt,
                                     bool add_bos) {
  std::vector<int64_t> ids;
  if (add_bos) ids.push_back(tokenizer.eod());
  for (int64_t id : tokenizer.encode(prompt)) ids.push_back(id);
  return ids;
}

ResultText detokenize(const Tokenizer& tokenizer, const inference::GenerationResult& r) {
  ResultText out;
  out.text = tokenizer.decode(r.tokens);
  for (int64_t id : r.tokens) out.segments.push_back(tokenizer.decode(std::span(&id, 1)));
  return out;
}

}  // namespace megatron::cli
