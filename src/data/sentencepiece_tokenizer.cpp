// SentencePiece through libsentencepiece: load from the file's bytes (one read, hashed for the
// identity), then Encode/Decode, turning util::Status failures into errors that name the file.
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"

namespace megatron {

SentencePieceTokenizer::SentencePieceTokenizer(std::string type, const std::string& model_file)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()),
      model_file_(model_file) {
  const std::string bytes = read_tokenizer_file(model_file, "--tokenizer-model");
  const auto status = processor_->LoadFromSerializedProto(bytes);
  MEGATRON_CHECK(status.ok(), "--tokenizer-model ", model_file, ": not a SentencePiece model (",
                 status.ToString(), "); ", type, " needs a SentencePiece tokenizer.model");
  vocab_size_ = processor_->GetPieceSize();
  eos_id_ = processor_->eos_id();
  identity_ = type + "/sha256:" + sha256_hex(bytes);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  MEGATRON_CHECK(status.ok(), "SentencePiece encode with ", model_file_,
                 " failed: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(std::span<const int64_t> ids) const {
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (const int64_t id : ids) {
    MEGATRON_CHECK(id >= 0 && id < vocab_size_, "SentencePiece: token id ", id,
                   " is outside the vocabulary [0, ", vocab_size_, ") of ", model_file_);
    pieces.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = processor_->Decode(pieces, &text);
  MEGATRON_CHECK(status.ok(), "SentencePiece decode with ", model_file_,
                 " failed: ", status.ToString());
  // Byte-fallback pieces can end mid-character.
  return is_valid_utf8(text) ? text : replace_invalid_utf8(text);
}

int64_t SentencePieceTokenizer::eod() const {
  MEGATRON_CHECK(
      eos_id_ >= 0, "--tokenizer-model ", model_file_,
      ": the SentencePiece model has no eos piece, which Megatron uses as EOD; train it ",
      "with --eos_id set");
  return eos_id_;
}

}  // namespace megatron
