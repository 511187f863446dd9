// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer: a SentencePiece
// `tokenizer.model` run through libsentencepiece.
//
// Current Megatron builds all three names the same way (the sentencepiece library, non-legacy):
// encode = the model's ids for the text with no BOS/EOS added, decode = the model's detokenizer,
// vocab_size = the model's piece count, EOD = the model's eos id. Invalid UTF-8 is replaced by
// U+FFFD first, as for the BPE tokenizers. Megatron's legacy mode (extra <CLS>/<SEP>/<EOD>/<MASK>
// pieces split out of the text) is not implemented.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megatron {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // `type` is the --tokenizer-type it was built for (it enters identity()).
  SentencePieceTokenizer(std::string type, const std::string& model_file);
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  // The model's eos id; an error for a model trained without one (--eos_id=-1).
  int64_t eod() const override;
  std::string identity() const override { return identity_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string model_file_;
  int64_t vocab_size_ = 0;
  int64_t eos_id_ = -1;
  std::string identity_;
};

}  // namespace megatron
