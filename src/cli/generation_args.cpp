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
  t.add("--inference-max-requests", g.inference_max_requests,
        "Prompts generated together in one batch (Megatron's static inference context)");
  t.add("--inference-max-batch-size", g.inference_max_batch_size,
        "Earlier name of --inference-max-requests");
  t.add("--max-batch-size", g.max_batch_size,
        "Deprecated in favor of --inference-max-requests (the larger applies)");
  t.add("--inference-max-seq-length", g.inference_max_seq_length,
        "Longest prompt plus tokens to generate, image embeddings included (Megatron's static "
        "inference context, for decoder-only models; --max-position-embeddings bounds it too)");
  t.add("--seed", g.seed, "Random seed of the sampling");
}

inference::SamplingParams sampling_of(const GenerationArgs& g, int64_t vocab_size) {
  inference::SamplingParams p{static_cast<float>(g.temperature), g.top_k,
                              static_cast<float>(g.top_p)};
  inference::check_sampling(p, vocab_size);
  return p;
}

void resolve_generation_args(GenerationArgs& g, const ArgTable& t) {
  if (t.given("--inference-max-batch-size")) {
    MEGATRON_CHECK(!t.given("--inference-max-requests") ||
                       g.inference_max_requests == g.inference_max_batch_size,
                   "--inference-max-requests ", g.inference_max_requests,
                   " and --inference-max-batch-size ", g.inference_max_batch_size,
                   " are two names of the batch size: give one of them");
    g.inference_max_requests = g.inference_max_batch_size;
  }
  g.inference_max_requests = std::max(g.inference_max_requests, g.max_batch_size);
  MEGATRON_CHECK(g.inference_max_requests >= 1, "--inference-max-requests must be >= 1, got ",
                 g.inference_max_requests);
  MEGATRON_CHECK(g.inference_max_seq_length >= 1, "--inference-max-seq-length must be >= 1, got ",
                 g.inference_max_seq_length);
}

int64_t max_batch_of(const GenerationArgs& g) {
  return g.inference_max_requests;
}

inference::GeneratorConfig generator_config(const GenerationArgs& g, const Tokenizer& tokenizer,
                                            int64_t max_position_embeddings) {
  return inference::GeneratorConfig{tokenizer.vocab_size(), tokenizer.eod(),
                                    max_position_embeddings, max_batch_of(g),
                                    g.inference_max_seq_length};
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
