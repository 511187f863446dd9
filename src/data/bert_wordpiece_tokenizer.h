// BertWordPieceTokenizer: Megatron's BertWordPieceLowerCase and BertWordPieceCase (Google's BERT
// tokenization as megatron/training/tokenizer/bert_tokenization.py restates it).
//
// encode = basic tokenizer, then WordPiece per word:
// - basic: drop U+0000, U+FFFD and control characters (Unicode Cc and Cf, except tab, newline and
//   carriage return, which count as whitespace); whitespace (space, \t, \n, \r, Zs) becomes a
//   space; CJK ideographs get spaces around them; split on whitespace; lower-case (full Unicode
//   mapping, as Python's str.lower) and strip accents (NFD, drop Mn) when lower-casing; split off
//   every punctuation character (ASCII 33-47, 58-64, 91-96, 123-126 and Unicode P*).
// - WordPiece: a word of more than 200 code points is [UNK] (Megatron's limit; Hugging Face's is
//   100); else greedy longest match from the left, continuations prefixed "##"; a word with a
//   position nothing matches is [UNK] as a whole.
// No [CLS]/[SEP] are added (Megatron's tokenize): the datasets place them.
//
// Vocabulary: vocab.txt, one token per line, id = line number, surrounding whitespace stripped.
// As Megatron: [BOS] and [EOS] are appended when missing, then <extra_id_0> .. for
// --vocab-extra-ids; EOD is [EOS]. [CLS], [SEP], [PAD], [MASK] and [UNK] must be in the file.
// Unicode properties, case mapping and NFD come from ICU (the version Debian ships; Python's
// unicodedata may be a Unicode version older, which only matters for characters assigned since).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace megatron {

class BertWordPieceTokenizer : public Tokenizer {
 public:
  // type: "BertWordPieceLowerCase" or "BertWordPieceCase". Errors name --vocab-file.
  BertWordPieceTokenizer(const std::string& type, const std::string& vocab_file,
                         int64_t vocab_extra_ids);

  std::vector<int64_t> encode(std::string_view text) const override;
  // Megatron's decode: pieces joined by spaces, " ##" removed, then the clean-up of spaces
  // before punctuation and English contractions.
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  int64_t eod() const override { return special_.eos; }
  std::string identity() const override { return identity_; }
  SpecialTokens special_tokens() const override { return special_; }
  std::string piece(int64_t id) const override;

  // The basic tokenizer's words (before WordPiece), UTF-8; exposed for tests.
  std::vector<std::string> basic_tokens(std::string_view text) const;

 private:
  void wordpiece(const std::u32string& word, std::vector<int64_t>& out) const;
  int64_t id_of(const std::string& token, const char* why) const;

  std::string type_, vocab_file_;
  bool lower_case_;
  std::vector<std::string> pieces_;                 // id -> token
  std::unordered_map<std::string, int64_t> vocab_;  // token -> id
  size_t max_piece_chars_ = 0;                      // longest token, in code points ("##" too)
  int64_t unk_ = -1;
  SpecialTokens special_;
  std::string identity_;
};

}  // namespace megatron
