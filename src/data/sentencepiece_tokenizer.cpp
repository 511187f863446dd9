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
  piece_count_ = vocab_size_ = processor_->GetPieceSize();
  eos_id_ = eod_id_ = processor_->eos_id();
  identity_ = type + "/sha256:" + sha256_hex(bytes);
  if (type == "Llama2Tokenizer") {
    bos_to_prepend_ = processor_->bos_id();
    MEGATRON_CHECK(bos_to_prepend_ >= 0, "--tokenizer-model ", model_file,
                   ": Llama2Tokenizer prepends BOS, but the model has no bos piece");
  }
  if (type == "GPTSentencePieceTokenizer") pad_id_ = processor_->pad_id();
  if (type != "SentencePieceTokenizer") return;
  // Megatron's _SentencePieceTokenizer: extend the vocabulary with its special tokens.
  auto piece_of = [&](int id, const char* fallback) {
    return id >= 0 && id < piece_count_ ? processor_->IdToPiece(id) : std::string(fallback);
  };
  auto add = [&](const std::string& token) {
    int64_t id = -1;
    const int found = processor_->PieceToId(token);
    if (found >= 0 && found < piece_count_ && processor_->IdToPiece(found) == token) {
      id = found;
    } else {
      for (const auto& [t, existing] : specials_)
        if (t == token) id = existing;
      if (id < 0) id = vocab_size_++;
    }
    for (auto& [t, existing] : specials_)
      if (t == token) return existing;
    specials_.emplace_back(token, id);
    return id;
  };
  add("<CLS>");
  add("<SEP>");
  eod_id_ = add("<EOD>");
  add("<MASK>");
  pad_id_ = add(piece_of(processor_->pad_id(), "<PAD>"));
  add(piece_of(processor_->bos_id(), "<BOS>"));
  eos_id_ = add(piece_of(processor_->eos_id(), "<EOS>"));
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode_plain(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  MEGATRON_CHECK(status.ok(), "SentencePiece encode with ", model_file_,
                 " failed: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  std::vector<int64_t> out;
  if (bos_to_prepend_ >= 0) out.push_back(bos_to_prepend_);
  size_t idx = 0;
  for (;;) {
    // The special token that occurs first from idx (ties: Megatron's insertion order).
    size_t best = std::string_view::npos;
    const std::pair<std::string, int64_t>* which = nullptr;
    for (const auto& special : specials_) {
      const size_t at = text.find(special.first, idx);
      if (at < best) {
        best = at;
        which = &special;
      }
    }
    if (!which) break;
    const auto piece = encode_plain(text.substr(idx, best - idx));
    out.insert(out.end(), piece.begin(), piece.end());
    out.push_back(which->second);
    idx = best + which->first.size();
  }
  const auto rest = encode_plain(text.substr(idx));
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::string SentencePieceTokenizer::decode_plain(std::span<const int64_t> ids) const {
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (const int64_t id : ids) {
    MEGATRON_CHECK(id >= 0 && id < piece_count_, "SentencePiece: token id ", id,
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

std::string SentencePieceTokenizer::decode(std::span<const int64_t> ids) const {
  if (specials_.empty()) return decode_plain(ids);
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (const auto& [token, id] : specials_) {
      if (ids[i] != id) continue;
      text += decode_plain(ids.subspan(last, i - last)) + " " + token + " ";
      last = i + 1;
      break;
    }
  }
  return text + decode_plain(ids.subspan(last));
}

int64_t SentencePieceTokenizer::eod() const {
  MEGATRON_CHECK(
      eod_id_ >= 0, "--tokenizer-model ", model_file_,
      ": the SentencePiece model has no eos piece, which Megatron uses as EOD; train it ",
      "with --eos_id set");
  return eod_id_;
}

}  // namespace megatron
