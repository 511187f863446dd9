// HuggingFaceTokenizer: a HuggingFace `tokenizer.json` whose model is byte-level BPE (GPT-2,
// RoBERTa, Llama-3, Qwen, Mistral-Nemo style), run without Python.
//
// Supported components, and nothing else (anything else is an error naming the file and the
// component): normalizer null; pre_tokenizer ByteLevel{add_prefix_space, use_regex}, Split{Regex or
// String pattern, behavior Isolated or Removed, invert false}, or a Sequence of those that holds a
// ByteLevel; model BPE (vocab, merges as "a b" strings or ["a", "b"] pairs, ignore_merges; no
// dropout, byte fallback or subword affixes); decoder ByteLevel; post_processor null, ByteLevel,
// TemplateProcessing (single template), RobertaProcessing, BertProcessing, or a Sequence of those.
// added_tokens are split out of the text before pre-tokenization (HF's two passes: tokens with
// normalized=false first, leftmost-longest, with lstrip/rstrip), so "<|endoftext|>" in text becomes
// its id here, unlike GPT2BPETokenizer. encode() applies the post-processor's template (e.g.
// Llama-3's BOS), as Megatron's tokenizer(text).input_ids does.
//
// EOD, in order: the eos_token of a tokenizer_config.json beside tokenizer.json; else the first of
// "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>" that the tokenizer knows. The pad: that
// config's pad_token, or none. vocab_size =
// largest id + 1 over the vocabulary and added tokens (len(tokenizer) for files without id holes).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "data/gpt2_bpe_tokenizer.h"
#include "data/tokenizer.h"

namespace megatron {

class HuggingFaceTokenizer : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one. include_special_tokens false (Megatron
  // core 0.19's --tokenizer-hf-no-include-special-tokens): encode() leaves out the
  // post-processor's tokens (a BOS, say) and decode() the special tokens, as Megatron's
  // tokenize() then goes through tokenize + convert_tokens_to_ids and skips them in detokenize().
  explicit HuggingFaceTokenizer(const std::string& path, bool include_special_tokens = true);
  ~HuggingFaceTokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  // Without the post-processor's template (HF's add_special_tokens=False: what
  // apply_chat_template(tokenize=True) encodes a rendered conversation with).
  std::vector<int64_t> encode_plain(std::string_view text) const;
  // HF's convert_tokens_to_ids for one token: an added token's id, else the vocabulary's (the
  // byte-mapped string); -1 when the tokenizer has neither.
  int64_t token_to_id(const std::string& token) const;
  std::string decode(std::span<const int64_t> ids) const override;
  // decode() without the added tokens marked special ("special": true), as the tokenizers
  // library's decode(skip_special_tokens=True).
  std::string decode_skipping_special(std::span<const int64_t> ids) const;
  int64_t vocab_size() const override { return vocab_size_; }
  // See the file comment for the rule; an error when no token qualifies.
  int64_t eod() const override;
  // tokenizer_config.json's pad_token (Megatron core 0.19's HuggingFaceTokenizer.pad_id, which
  // GPT data masks); -1 without one (r0.14's Hugging Face tokenizer had no pad at all).
  int64_t pad() const override { return pad_; }
  std::string identity() const override { return identity_; }

 private:
  struct AddedToken {
    std::string content;
    int64_t id = 0;
    bool lstrip = false, rstrip = false, normalized = true, special = false;
  };
  // One pre-tokenizer step, applied to every piece the previous step produced.
  struct Step {
    bool byte_level = false;                   // ByteLevel, else Split
    bool add_prefix_space = false;             // ByteLevel
    bool remove_matches = false;               // Split: behavior Removed (else Isolated)
    std::unique_ptr<PreTokenizerRegex> regex;  // null: ByteLevel with use_regex false
  };
  // A piece of the input: an added token's id, or text [begin, end).
  struct Segment {
    int64_t added_id;  // -1 for text
    size_t begin, end;
  };

  void split_added_tokens(std::string_view text, bool normalized_pass,
                          std::vector<Segment>* segments) const;
  void encode_text(std::string_view piece, size_t step, std::vector<int64_t>* ids) const;
  std::string decode_ids(std::span<const int64_t> ids, bool skip_special) const;

  std::string path_;
  bool include_special_tokens_ = true;
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::vector<Step> steps_;
  std::vector<AddedToken> added_;
  // For each first byte, the added tokens starting with it, longest first.
  std::vector<std::vector<size_t>> added_by_first_byte_;
  std::unordered_map<int64_t, std::string> added_content_;
  std::unordered_set<int64_t> special_ids_;       // added tokens with "special": true
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // post-processor template around the text
  int64_t vocab_size_ = 0;
  int64_t eod_ = -1, pad_ = -1;
  std::string identity_;
};

}  // namespace megatron
