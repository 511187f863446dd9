// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer: a SentencePiece
// `tokenizer.model` run through libsentencepiece.
//
// The three names behave as Megatron's training tokenizers do:
// - GPTSentencePieceTokenizer: the model's ids, no BOS/EOS added; EOD = the model's eos id, pad
//   = the model's pad id (-1 without one).
// - Llama2Tokenizer: the same with the model's BOS prepended to every text; EOD = eos; no pad
//   (Megatron's Llama2 tokenizer keeps the model's pad id under another name than its `pad`
//   property reads, so its datasets see none).
// - SentencePieceTokenizer: the vocabulary is extended with <CLS>, <SEP>, <EOD>, <MASK> and the
//   pad, BOS and EOS pieces (each appended unless the model has it; a missing pad/BOS/EOS is
//   named <PAD>/<BOS>/<EOS>), these special tokens are split out of the text before encoding
//   (earliest occurrence first), EOD is the id of <EOD> and pad that of the pad piece. Decoding
//   writes a special token as " <TOKEN> " between decoded pieces, as Megatron's detokenize does.
// Invalid UTF-8 is replaced by U+FFFD first, as for the BPE tokenizers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  int64_t pad() const override { return pad_id_; }
  std::string identity() const override { return identity_; }

 private:
  std::vector<int64_t> encode_plain(std::string_view text) const;
  std::string decode_plain(std::span<const int64_t> ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string model_file_;
  int64_t piece_count_ = 0;  // the model's own pieces; vocab_size_ adds appended specials
  int64_t vocab_size_ = 0;
  int64_t eos_id_ = -1;
  int64_t eod_id_ = -1;
  int64_t pad_id_ = -1;
  int64_t bos_to_prepend_ = -1;  // Llama2Tokenizer
  // SentencePieceTokenizer's special tokens in Megatron's insertion order (text, id).
  std::vector<std::pair<std::string, int64_t>> specials_;
  std::string identity_;
};

}  // namespace megatron
