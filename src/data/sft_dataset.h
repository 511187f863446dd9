// Megatron's supervised finetuning data (--sft): conversations in JSON lines, rendered with a
// prompt format, tokenized, the system and user turns masked out of the loss.
//
// - The file (Megatron's SFTLowLevelDataset): one JSON object per line with "messages", a list of
//   {"role": "system" | "user" | "assistant", "content": "..."}.
// - The tokenizer (SFTTokenizer, --tokenizer-type SFTTokenizer --tokenizer-model DIR): a Hugging
//   Face tokenizer.json, with --sft-tokenizer-prompt-format's chat template. Megatron r0.14 has
//   one, nemotron-h-aligned: system "<SPECIAL_10>System\n{content}\n", user
//   "<SPECIAL_11>User\n{content}\n<SPECIAL_11>Assistant\n", assistant "{content}\n" (contents
//   stripped of surrounding white space), no BOS, pad "<SPECIAL_233>". The rendered conversation
//   is encoded without the tokenizer's special-token template (apply_chat_template); each turn
//   rendered alone must encode to its span of those tokens (Megatron asserts it), and the target
//   is the tokens with the system and user turns' spans set to -100.
// - A sample (SFTDataset): conversation `index mod n` of the split's n conversations, in order
//   (no shuffle); tokens cut to --seq-length - 1, EOD appended, padded with the pad id to
//   --seq-length + 1; the model reads tokens[:-1] and predicts target[1:]; the loss mask is 0
//   where that target is the pad id or -100. Positions 0..s-1, causal attention (no document
//   masks: Megatron asserts --reset-position-ids and --reset-attention-mask off).
// A sample record is 2s values: the s input tokens, then the s targets as Megatron has them
// (-100 included); sft_batch_fields turns records into a GPT micro-batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/data_config.h"
#include "data/gpt_batch.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/sample_source.h"

namespace megatron {

inline constexpr int64_t kSftIgnoreIndex = -100;  // Megatron's IGNORE_INDEX

struct SftMessage {
  std::string role, content;
};
struct SftConversation {
  std::vector<SftMessage> messages;
  int64_t line = 0;  // in its file, 1-based (for messages)
};

// Every line of a JSON-lines file (blank lines skipped). Errors name the file and the line.
std::vector<SftConversation> read_sft_conversations(const std::string& path);

// SFTTokenizer's conversation tokenization for one prompt format.
class SftTokenizer {
 public:
  // Throws InvalidArgument naming --sft-tokenizer-prompt-format for an unknown format, and the
  // tokenizer file when it lacks the format's pad token. `tokenizer` must outlive this (the
  // trainer's does: it outlives the datasets).
  SftTokenizer(const HuggingFaceTokenizer& tokenizer, const std::string& format);

  // The rendered conversation's tokens and their targets (-100 on system and user turns).
  // Errors (empty assistant turn, assistant not after user, a turn whose tokens differ alone,
  // an unknown role) say which.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> tokenize(const SftConversation& c) const;
  // The chat template applied to `messages`, as text.
  std::string render(const std::vector<SftMessage>& messages) const;
  int64_t pad() const { return pad_; }
  int64_t eod() const { return tokenizer_.eod(); }

 private:
  const HuggingFaceTokenizer& tokenizer_;
  int64_t pad_ = -1;
};

class SftDataset : public SampleSource {
 public:
  // Conversations [begin, end) of `conversations` (from `path`, for messages), num_samples of them
  // read cyclically.
  SftDataset(std::shared_ptr<const std::vector<SftConversation>> conversations, int64_t begin,
             int64_t end, int64_t num_samples, int64_t seq_length,
             std::shared_ptr<const SftTokenizer> tokenizer, std::string path);

  int64_t size() const override { return num_samples_; }
  int64_t seq_length() const override { return seq_length_; }
  int64_t sample_width() const override { return 2 * seq_length_; }
  void sample(int64_t index, int64_t* out) const override;

 private:
  std::shared_ptr<const std::vector<SftConversation>> conversations_;
  int64_t begin_, end_, num_samples_, seq_length_;
  std::shared_ptr<const SftTokenizer> tokenizer_;
  std::string path_;
};

// The --sft splits: --data-path (one file, its conversations divided by --split as Megatron
// divides documents) or one file per --train/valid/test-data-path; each split sized by `counts`
// (absent where its count or its conversations are zero). Blends of several files are refused.
Datasets build_sft_datasets(const DataConfig& config, const HuggingFaceTokenizer& tokenizer,
                            int64_t seq_length, const SampleCounts& counts, bool log);

// The micro-batch of samples [first, first + b) of an SftDataset: tokens, labels (a masked -100
// target read as `pad`, a valid id the loss mask zeroes), the loss mask and positions.
GPTBatch make_sft_batch(const SampleSource& data, int64_t first, int64_t b, int64_t pad);

}  // namespace megatron
