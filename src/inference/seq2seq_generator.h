// Encoder-decoder generation (T5): each prompt is the encoder's input, run once; the decoder
// starts from a start token and adds one token per step, attending causally to its own tokens
// through the KV cache and to the encoder's output through the cached cross-attention keys and
// values (Megatron's T5 inference wrapper and encoder-decoder text generation controller).
//
// Prompts of different lengths share a batch: the encoder input is padded with the pad id and
// the padding is masked out of every cross-attention. Every sequence decodes the same positions;
// a sequence stops after tokens_to_generate tokens or at the end token, which it keeps. The next
// token is sample_token's (greedy with top_k 1) of the last position's logits, the draw from
// Philox(seed, prompt index, position) as in the decoder-only generator, so a seed gives the same
// tokens on every rank, layout and batch split. logprobs[t] is log p(token t | start, tokens < t)
// under the raw logits over the tokenizer's vocabulary.
//
// use_cache false runs the whole decoder input again at every step (the reference the cached
// path is tested against). Collective over the tensor-parallel group: every rank calls it with
// the same request.
#pragma once

#include <cstdint>
#include <vector>

#include "inference/sampling.h"
#include "models/t5/t5_model.h"

namespace megatron::inference {

struct Seq2SeqRequest {
  std::vector<std::vector<int64_t>> prompts;  // encoder inputs, each non-empty
  int64_t tokens_to_generate = 30;
  SamplingParams sampling;
  uint64_t seed = 0;
  bool return_log_probs = false;
};

struct Seq2SeqConfig {
  int64_t vocab_size = 0;  // the tokenizer's
  int64_t start = 0;       // the decoder's first token (Megatron's T5: [BOS]; HF T5: pad)
  int64_t end = -1;        // stops a sequence (Megatron's T5: [EOS]; HF T5: </s>); -1: none
  int64_t pad = 0;         // pads the encoder inputs
  int64_t max_batch = 64;  // prompts per batch
};

struct Seq2SeqResult {
  std::vector<int64_t> tokens;  // the generated tokens (the end token too), without the start
  std::vector<float> logprobs;  // one per generated token, when asked for
};

// Refuses (InvalidArgument naming the flag) an empty prompt, a prompt longer than the encoder's
// --encoder-seq-length positions where they are learned, or a generation past the decoder's.
void check_seq2seq_request(const Seq2SeqRequest& request, const TransformerConfig& cfg);

std::vector<Seq2SeqResult> generate_seq2seq(const T5Model& model, const Seq2SeqRequest& request,
                                            const Seq2SeqConfig& config, bool use_cache = true);

}  // namespace megatron::inference
