// NullTokenizer: the text is already token ids, written as decimal integers separated by spaces.
//
// Megatron's NullTokenizer, for benchmarks and tests that need a tokenizer but no vocabulary files:
// vocab_size = --vocab-size and EOD = vocab_size - 1 (current Megatron). It is not a tokenizer of
// natural text: anything but ids in [0, vocab_size) separated by whitespace is an error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace megatron {

class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);

  // "3 1 4" -> {3, 1, 4}. Runs of spaces, tabs and newlines separate ids; empty text -> {}.
  std::vector<int64_t> encode(std::string_view text) const override;
  // {3, 1, 4} -> "3 1 4".
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return vocab_size_ - 1; }
  std::string identity() const override;

 private:
  int64_t vocab_size_;
};

}  // namespace megatron
