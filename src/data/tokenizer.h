// Tokenizer: text <-> token ids, selected by Megatron's --tokenizer-type.
//
// Implementations: GPT2BPETokenizer (encoder.json + vocab.bpe, byte-level BPE with GPT-2's
// pre-tokenizer through PCRE2), HuggingFaceTokenizer (BPE tokenizer.json), SentencePieceTokenizer
// (libsentencepiece), BertWordPieceLowerCase / BertWordPieceCase (WordPiece with BERT's basic
// tokenizer, ICU for the Unicode rules), TikTokenizer (tiktoken's BPE over a ranked JSON
// vocabulary), NullTokenizer (text is space-separated ids). encode() and
// decode() are safe to call from several threads at once (preprocessing runs one per worker
// thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megatron {

struct TokenizerArgs {
  std::string type = "NullTokenizer";  // --tokenizer-type
  std::string vocab_file;              // --vocab-file (GPT-2 encoder.json)
  std::string merge_file;              // --merge-file (GPT-2 vocab.bpe)
  std::string tokenizer_model;         // --tokenizer-model (tokenizer.json or SentencePiece .model)
  int64_t vocab_size = 0;              // --vocab-size (NullTokenizer)
  int64_t vocab_extra_ids = 0;         // --vocab-extra-ids: <extra_id_i> sentinels (WordPiece)
  // TikTokenizer (data/tiktoken_tokenizer.h): --tiktoken-pattern v1|v2, the number of special
  // ids before the vocabulary and the named special tokens (empty: <unk> <s> </s>).
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tiktoken_special_tokens;
  int64_t null_tokenizer_eod_id = -1;  // --null-tokenizer-eod-id (NullTokenizer; -1: V - 1)
  int64_t null_tokenizer_pad_id = -1;  // --null-tokenizer-pad-id (NullTokenizer; -1: no pad)
  // HuggingFaceTokenizer without its post-processor's tokens (Megatron core 0.19's
  // --tokenizer-hf-no-include-special-tokens; data/hf_bpe_tokenizer.h).
  bool hf_include_special_tokens = true;
};

// Whether the tokenizer type takes its vocabulary size from --vocab-size (NullTokenizer's ids,
// TikTokenizer's cut of its vocabulary) rather than from its files alone.
bool tokenizer_reads_vocab_size(const std::string& type);

// Megatron's special-token ids (tokenizer.cls, .sep, .pad, .mask, .bos, .eos and
// .additional_special_tokens_ids); -1 where the tokenizer has none.
struct SpecialTokens {
  int64_t cls = -1, sep = -1, pad = -1, mask = -1, bos = -1, eos = -1;
  std::vector<int64_t> additional;  // --vocab-extra-ids sentinels, in order
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int64_t> ids) const = 0;
  // Number of token ids (before Megatron's padding), special tokens included.
  virtual int64_t vocab_size() const = 0;
  // End-of-document id, as Megatron defines it for this tokenizer.
  virtual int64_t eod() const = 0;
  // Identity for caches and checkpoints: type plus a digest of the files that define it.
  virtual std::string identity() const = 0;
  // The special tokens BERT- and T5-style data need (none by default).
  virtual SpecialTokens special_tokens() const { return {}; }
  // Megatron's tokenizer.pad, which its GPT datasets mask out of the loss and map to id 0; -1
  // where Megatron's tokenizer has none (its property raises). It can differ from
  // special_tokens().pad: Megatron's SentencePiece tokenizers have a pad but serve no BERT data.
  virtual int64_t pad() const { return special_tokens().pad; }
  // The vocabulary string of `id` (WordPiece's "##" marks continuations, which whole-word
  // masking reads). Tokenizers without a string vocabulary throw InvalidArgument.
  virtual std::string piece(int64_t id) const;
};

// Builds the tokenizer named by args.type. Errors name the flag or file and the fix.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerArgs& args);

}  // namespace megatron
