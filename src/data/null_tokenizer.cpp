// NullTokenizer: parse and print space-separated ids, checking each against the vocabulary size.
#include "data/null_tokenizer.h"

#include <charconv>

#include "core/error.h"

namespace megatron {

NullTokenizer::NullTokenizer(int64_t vocab_size, int64_t eod, int64_t pad)
    : vocab_size_(vocab_size), eod_(eod < 0 ? vocab_size - 1 : eod), pad_(pad) {
  MEGATRON_CHECK(vocab_size > 0,
                 "NullTokenizer needs --vocab-size > 0 (ids are 0..V-1, EOD is V-1)", ", got ",
                 vocab_size);
  MEGATRON_CHECK(eod >= -1 && eod < vocab_size, "--null-tokenizer-eod-id ", eod,
                 " is no id of the vocabulary [0, ", vocab_size,
                 "); pass one or -1 (vocab_size - 1)");
  MEGATRON_CHECK(pad >= -1 && pad < vocab_size, "--null-tokenizer-pad-id ", pad,
                 " is no id of the vocabulary [0, ", vocab_size, "); pass one or -1 (no pad)");
}

std::vector<int64_t> NullTokenizer::encode(std::string_view text) const {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t begin = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i == begin) break;
    const std::string_view token = text.substr(begin, i - begin);
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), id);
    // from_chars accepts a leading '-'; ids never have one.
    MEGATRON_CHECK(ec == std::errc() && end == token.data() + token.size() && token[0] != '-',
                   "NullTokenizer: \"", token, "\" is not a token id; the text must be decimal ",
                   "ids separated by spaces");
    MEGATRON_CHECK(id < vocab_size_, "NullTokenizer: token id ", id, " is outside [0, ",
                   vocab_size_, ") set by --vocab-size");
    ids.push_back(id);
  }
  return ids;
}

std::string NullTokenizer::decode(std::span<const int64_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) text += ' ';
    text += std::to_string(ids[i]);
  }
  return text;
}

std::string NullTokenizer::identity() const {
  return "NullTokenizer/vocab_size=" + std::to_string(vocab_size_);
}

}  // namespace megatron
