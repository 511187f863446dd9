// GPT2BPETokenizer (encoder.json + vocab.bpe) and the byte-level BPE machinery it shares with
// HuggingFaceTokenizer: GPT-2's byte-to-unicode map, UTF-8 repair, a PCRE2 pre-tokenizer and the
// rank-ordered merge loop with a bounded, thread-safe cache.
//
// Encoding agrees token for token with OpenAI's encoder.py, which Megatron's GPT2BPETokenizer
// wraps: the same pre-tokenizer pattern with Python `regex` semantics (\s is Unicode White_Space),
// merges lowest rank first, all occurrences left to right. `<|endoftext|>` inside text is ordinary
// text, as in encoder.py; Megatron appends the EOD id itself. Invalid UTF-8 is replaced by U+FFFD
// (one per maximal ill-formed subpart) before encoding, which is what Python's and JavaScript's
// UTF-8 decoders do to such a file before any tokenizer sees it. This is not a BPE trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

struct pcre2_real_code_8;

namespace megatron {

// True when `text` is well-formed UTF-8 (no surrogates, no overlong forms, nothing past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// `text` with every ill-formed UTF-8 sequence replaced by U+FFFD, one per maximal subpart: the rule
// of the WHATWG Encoding Standard (JavaScript's TextDecoder) and of Python's errors="replace".
std::string replace_invalid_utf8(std::string_view text);

// Reads a whole file; the error names the flag it came from (e.g. "--vocab-file") and the path.
std::string read_tokenizer_file(const std::string& path, std::string_view flag);

// Lower-case hex SHA-256 of `bytes`, for Tokenizer::identity().
std::string sha256_hex(std::string_view bytes);

// A pre-tokenizer pattern compiled once with PCRE2 (UTF + UCP, JIT when available). `\s` and `\S`
// are rewritten to Unicode White_Space before compiling, so that they mean what they mean in Python
// `regex`, Rust `regex`/tiktoken and Oniguruma (HF tokenizers) rather than PCRE2's own set, which
// also holds U+180E. `\S` inside a character class keeps PCRE2's meaning. Matching is const and
// thread-safe: each thread keeps its own match data and JIT stack.
class PreTokenizerRegex {
 public:
  // `source` names where the pattern came from, for the compile error message.
  PreTokenizerRegex(std::string_view pattern, std::string_view source);
  ~PreTokenizerRegex();
  PreTokenizerRegex(const PreTokenizerRegex&) = delete;
  PreTokenizerRegex& operator=(const PreTokenizerRegex&) = delete;

  // Finds the first non-empty match in `text` (valid UTF-8) at or after byte `start`. Returns false
  // when there is none; otherwise sets [*begin, *end).
  bool next_match(std::string_view text, size_t start, size_t* begin, size_t* end) const;

  // Calls fn(begin, end) for each non-empty match, left to right.
  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    size_t pos = 0, begin = 0, end = 0;
    while (pos < text.size() && next_match(text, pos, &begin, &end)) {
      fn(begin, end);
      pos = end;
    }
  }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// GPT-2's pre-tokenizer pattern (encoder.py, tiktoken r50k_base, HF ByteLevel use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's reversible byte -> printable character map, as UTF-8 strings indexed by byte: bytes
// 33-126, 161-172 and 174-255 map to the same code point, the other 68 in increasing order to
// U+0100, U+0101, ... (space -> "Ġ" U+0120, newline -> "Ċ" U+010A).
const std::vector<std::string>& byte_to_unicode();

// Byte-level BPE over a vocabulary of byte-mapped strings and a ranked merge list.
//
// encode_piece(bytes): map each byte through byte_to_unicode() to a one-symbol token, then
// repeatedly merge the adjacent pair (a, b) with the lowest rank, leftmost first, re-ranking the
// neighbours after each merge (equivalent to encoder.py's "merge all occurrences of the best pair
// left to right" for merge lists learned in rank order, and exactly HF tokenizers' heap order).
// Results are cached per piece: the cache is sharded, mutex-protected and bounded.
class ByteLevelBpe {
 public:
  // vocab: byte-mapped token string -> id. merges: (left, right) in rank order. `source` names the
  // file for errors. Every merge's parts and result, and all 256 byte symbols, must be in vocab.
  // ignore_merges: a piece that is itself a vocab token is emitted whole (HF's ignore_merges).
  ByteLevelBpe(std::unordered_map<std::string, int64_t> vocab,
               const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
               std::string_view source);
  ~ByteLevelBpe();

  // Appends the ids of one pre-token given as raw UTF-8 bytes.
  void encode_piece(std::string_view bytes, std::vector<int64_t>* ids) const;
  // Appends the raw bytes behind token `id`; false for an id outside the vocabulary.
  bool append_token_bytes(int64_t id, std::string* out) const;
  // Id of a byte-mapped token string, or -1.
  int64_t token_id(std::string_view token) const;
  // Largest id in the vocabulary.
  int64_t max_id() const { return static_cast<int64_t>(id_bytes_.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(vocab_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct CacheShard;

  void merge_word(std::vector<int32_t>* symbols) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  std::vector<std::string> id_bytes_;           // id -> raw bytes (empty for holes)
  std::vector<bool> id_known_;
  int32_t byte_id_[256] = {};
  bool ignore_merges_ = false;
  std::unique_ptr<CacheShard[]> cache_;
};

// Megatron's GPT2BPETokenizer. EOD = id of "<|endoftext|>" (50256 for GPT-2); vocab_size = number
// of entries in encoder.json.
class GPT2BPETokenizer : public Tokenizer {
 public:
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  std::string identity() const override { return identity_; }

 private:
  std::unique_ptr<ByteLevelBpe> bpe_;
  PreTokenizerRegex regex_;
  int64_t vocab_size_ = 0;
  int64_t eod_ = 0;
  std::string identity_;
};

}  // namespace megatron
