// NullTokenizer: the text is already token ids, written as decimal integers separated by spaces.
//
// Megatron's NullTokenizer, for benchmarks and tests that need a tokenizer but no vocabulary files:
// vocab_size = --vocab-size, EOD = --null-tokenizer-eod-id (default vocab_size - 1) and pad =
// --null-tokenizer-pad-id (default -1: none), as in current Megatron. It is not a tokenizer of
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
  // eod -1: vocab_size - 1.
  explicit NullTokenizer(int64_t vocab_size, int64_t eod = -1, int64_t pad = -1);

  // "3 1 4" -> {3, 1, 4}. Runs of spaces, tabs and newlines separate ids; empty text -> {}.
  std::vector<int64_t> encode(std::string_view text) const override;
  // {3, 1, 4} -> "3 1 4".
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  int64_t pad() const override { return pad_; }
  std::string identity() const override;

 private:
  int64_t vocab_size_;
  int64_t eod_;
  int64_t pad_;
};

}  // namespace megatron
