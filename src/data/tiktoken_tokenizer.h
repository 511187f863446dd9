// TikTokenizer: Megatron's CustomTikTokenizer (--tokenizer-type TikTokenizer), the tiktoken
// byte-level BPE over a ranked vocabulary that NVIDIA's Nemotron and Mistral's Tekken
// tokenizers ship as JSON.
//
// The vocabulary (--tokenizer-model) is a JSON list of {"rank", "token_bytes" (base64),
// "token_str"} in rank order, the first 256 being the single bytes 0..255; it is cut to
// --vocab-size - --tiktoken-num-special-tokens entries. Ids: the special tokens first (the
// --tiktoken-special-tokens list, default <unk> <s> </s>, which it must contain, then
// <SPECIAL_i> fillers up to --tiktoken-num-special-tokens, default 1000), then the vocabulary,
// rank r at id r + that number. --vocab-size defaults to 131072 (2^17), as in Megatron.
//
// Encoding is tiktoken's encode_ordinary: the text is split by the pattern (--tiktoken-pattern v1
// or v2: Megatron's PATTERN_TIKTOKEN / PATTERN_TIKTOKEN_V2, through PCRE2 with \s as Unicode
// White_Space, as Rust's regex reads it); a piece that is a vocabulary token is that token, any
// other is byte-pair merged: the adjacent pair whose concatenation has the lowest rank first,
// leftmost on ties, until no concatenation is in the vocabulary (tiktoken's byte_pair_merge).
// Special tokens in the text are ordinary text. EOD is </s> (Megatron's eod = eos). Decoding
// joins the tokens' bytes (a special token's are its text) and replaces invalid UTF-8 as
// Python's errors="replace" does.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/gpt2_bpe_tokenizer.h"
#include "data/tokenizer.h"

namespace megatron {

// Megatron's patterns by --tiktoken-pattern name ("v1", "v2"); InvalidArgument otherwise.
std::string_view tiktoken_pattern(const std::string& name);

class TikTokenizer : public Tokenizer {
 public:
  // vocab_size <= 0: 131072. special_tokens empty: <unk> <s> </s>. Errors name the flag.
  TikTokenizer(const std::string& path, const std::string& pattern, int64_t vocab_size,
               int64_t num_special_tokens, std::vector<std::string> special_tokens);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  int64_t eod() const override { return eos_; }
  std::string identity() const override { return identity_; }
  SpecialTokens special_tokens() const override;
  // The token's bytes (a special token's text).
  std::string piece(int64_t id) const override;

 private:
  void encode_piece(std::string_view piece, std::vector<int64_t>* ids) const;
  int64_t rank_of(std::string_view bytes) const;

  PreTokenizerRegex regex_;
  std::vector<std::string> id_bytes_;                    // id -> bytes, specials included
  std::unordered_map<std::string_view, int64_t> ranks_;  // vocabulary bytes -> id (views)
  int64_t unk_ = 0, bos_ = 1, eos_ = 2;
  std::string identity_;
};

}  // namespace megatron
