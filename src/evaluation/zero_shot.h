// Megatron's zero-shot evaluation tasks (tasks/zeroshot_gpt, present up to r0.11), and multiple
// choice by log-likelihood, over one model replica in any TP x PP layout.
//
// A task is a list of samples, each a token sequence and a mask over its targets (token t + 1
// predicted from tokens 0..t); the Scorer runs them through the model in batches and returns, per
// target, the cross-entropy and whether the argmax over the tokenizer's vocabulary is the target;
// each task reduces those to its metric:
//   WIKITEXT103 (loss): windows of seq_len + 1 tokens every `stride` tokens (--overlapping-eval);
//     the first scores all its targets, each later one only its last `stride`, so every target is
//     scored once with at least seq_len - stride tokens of context. avg loss = sum of CE / (N - 1)
//     for N tokens; ppl = exp(min(20, avg loss)); token ratio = (N - 1) / (W - 1) for W original
//     space-separated words; adjusted ppl = exp(min(20, avg loss x token ratio)).
//   LAMBADA (accuracy): each JSON line's "text"; the target is its last token, or with
//     --strict-lambada the tokens of " " + its last whitespace-separated word after the stripped
//     text before it. Correct iff every target position's argmax is the target.
//   MULTIPLE_CHOICE: each JSON line's {"context", "choices", "answer"}; a choice scores the sum of
//     the log-probabilities of its tokens after the context's; the prediction is the best choice
//     (acc), and the best per character of the choice (acc_norm, lm-evaluation-harness's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/tokenizer.h"
#include "models/model_chunk.h"

namespace megatron::evaluation {

struct Sample {
  std::vector<int64_t> tokens;  // inputs and targets: tokens.size() - 1 targets
  std::vector<uint8_t> mask;    // tokens.size() - 1 entries: 1 where the target counts
};

struct TokenScores {
  std::vector<double> loss;      // per target: -log p(target | tokens before it)
  std::vector<uint8_t> correct;  // per target: the argmax over the vocabulary is the target
};

class Scorer {
 public:
  // vocab_size: the tokenizer's (padding rows of the output layer are never predictions).
  Scorer(const ModelChunk& chunk, ProcessGroup& pp, int64_t vocab_size, int64_t micro_batch);
  // The scores of every sample, on every rank. Batches of micro_batch samples, each padded to its
  // longest (causal attention: padding after a sequence does not change its scores). Collective.
  std::vector<TokenScores> score(const std::vector<Sample>& samples) const;

 private:
  const ModelChunk& chunk_;
  ProcessGroup& pp_;
  int64_t vocab_, micro_batch_;
};

// WIKITEXT103 (Megatron's _LMDataset): the windows over `tokens`, padded with `pad` to seq_len + 1.
std::vector<Sample> lm_windows(const std::vector<int64_t>& tokens, int64_t seq_len, int64_t stride,
                               int64_t pad);

struct LmMetrics {
  double loss_sum = 0;
  int64_t tokenized = 0, original = 0;
  double avg_loss = 0, ppl = 0, adjusted_ppl = 0, token_ratio = 0;
};
LmMetrics lm_metrics(const std::vector<Sample>& windows, const std::vector<TokenScores>& scores,
                     int64_t tokenized, int64_t original);

// Megatron's count of original tokens of a WikiText file: len(text.strip().split(" ")).
int64_t original_token_count(const std::string& text);

// LAMBADA: one line's sample (context, then the target tokens, the mask on the targets).
// InvalidArgument when the text has no word or the sample exceeds seq_len + 1 tokens.
// Padded with the end-of-document id to seq_len + 1, as Megatron's _LambadaDataset.
Sample lambada_sample(const std::string& text, const Tokenizer& tokenizer, bool strict,
                      int64_t seq_len);

struct ChoiceItem {
  std::vector<Sample> choices;        // context + choice, masked on the choice's tokens
  std::vector<int64_t> choice_chars;  // bytes of each choice's text
  int64_t answer = 0;
};
ChoiceItem choice_item(const std::string& context, const std::vector<std::string>& choices,
                       int64_t answer, const Tokenizer& tokenizer, int64_t seq_len);

struct AccuracyMetrics {
  int64_t correct = 0, total = 0;
  double accuracy() const { return total ? static_cast<double>(correct) / total : 0.0; }
};
// Correct iff every masked target is predicted.
AccuracyMetrics lambada_metrics(const std::vector<Sample>& samples,
                                const std::vector<TokenScores>& scores);
// acc and acc_norm over items whose choices' scores come in order, item after item.
void choice_metrics(const std::vector<ChoiceItem>& items, const std::vector<TokenScores>& scores,
                    AccuracyMetrics* acc, AccuracyMetrics* acc_norm);

}  // namespace megatron::evaluation
