// Generator: Megatron's static text generation (the legacy generate_tokens_probs_and_return_on_
// first_stage and the r0.14 static engine) over one model replica in any TP x PP layout.
//
// A batch of prompts (token ids) of different lengths is laid out in one [b, max] token matrix.
// The shared prefix (the shortest prompt) runs at once through the KV cache (prefill); then one
// position per step (decode): the last stage samples each sequence's next token from the last
// position's logits, a sequence still inside its prompt keeps its own token instead, and the
// new column is broadcast from the last pipeline stage to every other, so that every rank holds
// the same token matrix and the first stage embeds the next column. A sequence stops after its
// own tokens_to_generate tokens (as the r0.14 engine, per request; the legacy path ran every
// sequence to the longest prompt's end) or at the end-of-document token, which it keeps; the
// generation ends when every sequence has stopped.
//
// logprobs[t] is log p(token t + 1 | tokens 0..t) under the raw logits (no temperature, no
// filtering), over the tokenizer's vocabulary (the output layer's padding rows never receive
// probability here, as in training); prompt positions included, so a result of n tokens has
// n - 1 of them. Sampling draws u from Philox(seed, prompt index, position): a seed gives the
// same tokens on every rank and layout, for every batch split (up to the rounding of GEMMs of
// other row counts, which moves a draw only when it falls within ~1e-6 of a token's boundary).
//
// Collective over the model-parallel group: every rank calls generate() with the same request.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "inference/sampling.h"
#include "models/model_chunk.h"

namespace megatron::inference {

struct GenerationRequest {
  std::vector<std::vector<int64_t>> prompts;  // token ids, each non-empty
  int64_t tokens_to_generate = 30;            // 0: score the prompts (needs return_log_probs)
  SamplingParams sampling;
  bool return_log_probs = false;
  // Sampling draws of prompt i come from Philox(seed, i, position), or, when `streams` is given
  // (one per prompt), from Philox(streams[i].seed, streams[i].stream, position): requests merged
  // into one batch keep the draws they would have had alone.
  uint64_t seed = 0;
  struct Stream {
    uint64_t seed = 0, stream = 0;
  };
  std::vector<Stream> streams;
  bool stop_on_eod = true;  // stop a sequence at the end-of-document token
  // Scoring only (tokens_to_generate 0): the top_n_logprobs most likely tokens at every position
  // after the first, with their log-probabilities (the completions endpoint's "logprobs").
  int64_t top_n_logprobs = 0;
  // The legacy server's extras: top_p *= top_p_decay after every step, floored at top_p_bound;
  // stop at "\n" (stop_on_eol) or at "\n\n" and two "\n" in a row (stop_on_double_eol), with
  // GPT-2's ids 198 and 628 as Megatron hard-codes them; no "\n" right after ":".
  float top_p_decay = 0, top_p_bound = 0;
  bool stop_on_eol = false, stop_on_double_eol = false;
  bool prevent_newline_after_colon = false;
  int64_t colon_id = -1, newline_id = -1;  // the tokenizer's ":" and "\n" (for the rule above)
};

struct GenerationResult {
  std::vector<int64_t> tokens;  // the prompt, then the generated tokens (an end-of-document too)
  std::vector<float> logprobs;  // tokens.size() - 1 entries, when asked for
  // With top_n_logprobs: per position t >= 1, the most likely (token, log p(token | tokens < t)),
  // best first, ties by lower id.
  std::vector<std::vector<std::pair<int64_t, float>>> top_logprobs;
  int64_t prompt_length = 0;
};

// Where one batch of a generate() call spent its time (wall clock on this rank): prefill is the
// batch's first forward (the shortest prompt's positions at once, through the sampling of the
// first new column), decode every later step (one position per sequence). Positions count every
// row the model ran, b x positions, including a sequence that already stopped but shares the batch.
struct BatchTimes {
  int64_t prompts = 0, prefill_positions = 0, decode_positions = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

struct GeneratorConfig {
  int64_t vocab_size = 0;      // the tokenizer's (sampling and log-probabilities stop there)
  int64_t eod = 0;             // the end-of-document id
  int64_t max_positions = 0;   // prompt + generated tokens may not exceed it
  int64_t max_batch_size = 8;  // prompts per forward (--inference-max-requests)
  // Nor this (--inference-max-seq-length; 0: only the positions bound them).
  int64_t max_sequence_length = 0;
};

// Checks a request against the model (InvalidArgument naming the field): every prompt non-empty
// and within the vocabulary, prompt + tokens_to_generate within max_positions and
// max_sequence_length, the sampling
// settings, scoring (tokens_to_generate 0) only with log-probabilities, streams (if any) one per
// prompt. Pure: every rank agrees.
void check_request(const GenerationRequest& request, const GeneratorConfig& config);

class Generator {
 public:
  // chunk: this rank's stage of the model (no virtual pipeline); pp: the pipeline group (the
  // first stage is pp rank 0, the last pp.size() - 1).
  Generator(const ModelChunk& chunk, ProcessGroup& pp, GeneratorConfig config);

  const GeneratorConfig& config() const { return config_; }
  // check_request, then one result per prompt, in order; the prompts run in batches of at most
  // max_batch_size. times (optional) receives where each batch's time went.
  std::vector<GenerationResult> generate(const GenerationRequest& request,
                                         std::vector<BatchTimes>* times = nullptr) const;

 private:
  std::vector<GenerationResult> generate_batch(const GenerationRequest& request, size_t first,
                                               size_t count, BatchTimes& times) const;

  const ModelChunk& chunk_;
  ProcessGroup& pp_;
  GeneratorConfig config_;
};

}  // namespace megatron::inference
