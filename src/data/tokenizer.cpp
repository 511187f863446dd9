// build_tokenizer: maps Megatron's --tokenizer-type and its file flags to an implementation, and
// checks the flags each type needs before any file is opened.
#include "data/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "data/bert_wordpiece_tokenizer.h"
#include "data/gpt2_bpe_tokenizer.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/null_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

namespace megatron {

namespace {

constexpr const char* kSupported =
    "GPT2BPETokenizer, HuggingFaceTokenizer, SFTTokenizer, SentencePieceTokenizer, "
    "GPTSentencePieceTokenizer, "
    "Llama2Tokenizer, BertWordPieceLowerCase, BertWordPieceCase, TikTokenizer, NullTokenizer";

// The flag must be given and name an existing file (or, where allowed, a directory).
void require_path(const std::string& type, const char* flag, const std::string& path,
                  const char* what, bool directory_ok = false) {
  MEGATRON_CHECK(!path.empty(), "--tokenizer-type ", type, " needs ", flag, " (", what, ")");
  std::error_code ec;
  const bool ok = std::filesystem::is_regular_file(path, ec) ||
                  (directory_ok && std::filesystem::is_directory(path, ec));
  MEGATRON_CHECK(ok, flag, " ", path, ": no such file; pass the path of ", what);
}

}  // namespace

std::string Tokenizer::piece(int64_t id) const {
  MEGATRON_CHECK(false, "this tokenizer (", identity(), ") has no string vocabulary to look id ",
                 id,
                 " up in; BERT-style data needs a WordPiece tokenizer (--tokenizer-type "
                 "BertWordPieceLowerCase or BertWordPieceCase)");
  return {};
}

bool tokenizer_reads_vocab_size(const std::string& type) {
  return type == "NullTokenizer" || type == "TikTokenizer";
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerArgs& args) {
  const std::string& type = args.type;
  MEGATRON_CHECK(args.null_tokenizer_pad_id == -1 || type == "NullTokenizer",
                 "--null-tokenizer-pad-id sets NullTokenizer's pad, not ", type,
                 "'s; drop the flag (the tokenizer's own pad applies)");
  MEGATRON_CHECK(args.null_tokenizer_eod_id == -1 || type == "NullTokenizer",
                 "--null-tokenizer-eod-id sets NullTokenizer's EOD, not ", type,
                 "'s; drop the flag (the tokenizer's own EOD applies)");
  if (type == "GPT2BPETokenizer") {
    require_path(type, "--vocab-file", args.vocab_file, "GPT-2's encoder.json");
    require_path(type, "--merge-file", args.merge_file, "GPT-2's vocab.bpe");
    return std::make_unique<GPT2BPETokenizer>(args.vocab_file, args.merge_file);
  }
  // SFTTokenizer: the Hugging Face tokenizer under --sft's chat template (data/sft_dataset.h).
  if (type == "HuggingFaceTokenizer" || type == "SFTTokenizer") {
    require_path(type, "--tokenizer-model", args.tokenizer_model,
                 "a HuggingFace tokenizer.json or its directory", /*directory_ok=*/true);
    return std::make_unique<HuggingFaceTokenizer>(args.tokenizer_model,
                                                  args.hf_include_special_tokens);
  }
  if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" ||
      type == "Llama2Tokenizer") {
    require_path(type, "--tokenizer-model", args.tokenizer_model, "a SentencePiece .model file");
    return std::make_unique<SentencePieceTokenizer>(type, args.tokenizer_model);
  }
  if (type == "BertWordPieceLowerCase" || type == "BertWordPieceCase") {
    require_path(type, "--vocab-file", args.vocab_file, "a WordPiece vocab.txt");
    return std::make_unique<BertWordPieceTokenizer>(type, args.vocab_file, args.vocab_extra_ids);
  }
  MEGATRON_CHECK(args.vocab_extra_ids == 0,
                 "--vocab-extra-ids applies to the WordPiece "
                 "tokenizers (BertWordPieceLowerCase, BertWordPieceCase), not ",
                 type);
  if (type == "TikTokenizer") {
    require_path(type, "--tokenizer-model", args.tokenizer_model,
                 "a tiktoken vocabulary JSON (a list of rank, token_bytes, token_str)");
    return std::make_unique<TikTokenizer>(args.tokenizer_model, args.tiktoken_pattern,
                                          args.vocab_size, args.tiktoken_num_special_tokens,
                                          args.tiktoken_special_tokens);
  }
  if (type == "NullTokenizer") {
    MEGATRON_CHECK(args.vocab_size > 0,
                   "--tokenizer-type NullTokenizer needs --vocab-size > 0, got ", args.vocab_size);
    return std::make_unique<NullTokenizer>(args.vocab_size, args.null_tokenizer_eod_id,
                                           args.null_tokenizer_pad_id);
  }
  MEGATRON_CHECK(false, "--tokenizer-type ", type, " is not supported; use one of: ", kSupported);
  return nullptr;
}

}  // namespace megatron
