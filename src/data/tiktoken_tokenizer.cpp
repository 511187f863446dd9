// Megatron's CustomTikTokenizer: the JSON vocabulary, the special-token layout, tiktoken's
// byte-pair merge and decoding.
#include "data/tiktoken_tokenizer.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace megatron {
namespace {

// megatron/training/tokenizer/tokenizer.py, PATTERN_TIKTOKEN and PATTERN_TIKTOKEN_V2.
constexpr std::string_view kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr std::string_view kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Megatron's fallback when --vocab-size is not given.
constexpr int64_t kDefaultVocabSize = 1 << 17;
constexpr int64_t kNoRank = std::numeric_limits<int64_t>::max();

// Strict standard base64 (Python's b64decode with validation): whole quads of the alphabet,
// '=' only as the last one or two characters.
bool is_base64(const std::string& text) {
  if (text.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  for (size_t i = 0; i + pad < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (!std::isalnum(c) && c != '+' && c != '/') return false;
  }
  return true;
}

std::string base64_decode(const std::string& text, const std::string& where) {
  MEGATRON_CHECK(is_base64(text), where, ": token_bytes \"", text, "\" is not base64");
  std::string out(text.size() / 4 * 3 + 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  MEGATRON_CHECK(n >= 0, where, ": token_bytes \"", text, "\" is not base64");
  // EVP_DecodeBlock counts the padding's zero bytes.
  size_t len = static_cast<size_t>(n);
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --len;
  out.resize(len);
  return out;
}

}  // namespace

std::string_view tiktoken_pattern(const std::string& name) {
  if (name == "v1") return kPatternV1;
  if (name == "v2") return kPatternV2;
  MEGATRON_CHECK(false, "--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2",
                 name.empty() ? std::string() : ", got '" + name + "'");
  return {};
}

TikTokenizer::TikTokenizer(const std::string& path, const std::string& pattern, int64_t vocab_size,
                           int64_t num_special_tokens, std::vector<std::string> special_tokens)
    : regex_(tiktoken_pattern(pattern), "TikTokenizer --tiktoken-pattern " + pattern) {
  MEGATRON_CHECK(vocab_size >= 0, "--vocab-size must be positive, got ", vocab_size);
  if (vocab_size == 0) vocab_size = kDefaultVocabSize;  // not given
  // Megatron's checks on the special tokens, then its fillers.
  const std::vector<std::string> required = {"<unk>", "<s>", "</s>"};
  if (special_tokens.empty()) special_tokens = required;
  const std::set<std::string> unique(special_tokens.begin(), special_tokens.end());
  MEGATRON_CHECK(unique.size() == special_tokens.size(),
                 "--tiktoken-special-tokens: the special tokens must be unique");
  for (const std::string& r : required)
    MEGATRON_CHECK(unique.count(r), "--tiktoken-special-tokens must include <unk>, <s> and </s>");
  MEGATRON_CHECK(static_cast<int64_t>(special_tokens.size()) <= num_special_tokens &&
                     num_special_tokens < vocab_size,
                 "--tiktoken-num-special-tokens ", num_special_tokens, " must be at least the ",
                 special_tokens.size(), " special tokens and below --vocab-size ", vocab_size);
  for (int64_t i = static_cast<int64_t>(special_tokens.size()); i < num_special_tokens; ++i)
    special_tokens.push_back("<SPECIAL_" + std::to_string(i) + ">");
  // Megatron checks again with the fillers: a named token may not be one of them.
  MEGATRON_CHECK(std::set<std::string>(special_tokens.begin(), special_tokens.end()).size() ==
                     special_tokens.size(),
                 "--tiktoken-special-tokens: a named token repeats a filler <SPECIAL_i> of "
                 "--tiktoken-num-special-tokens; the special tokens must be unique");
  MEGATRON_CHECK(vocab_size - num_special_tokens >= 256, "--vocab-size ", vocab_size, " leaves ",
                 vocab_size - num_special_tokens, " ids after --tiktoken-num-special-tokens ",
                 num_special_tokens, "; the vocabulary needs at least its 256 single bytes");

  const std::string where = "--tokenizer-model " + path;
  const std::string text = read_tokenizer_file(path, "--tokenizer-model");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_CHECK(false, where, ": not JSON (", e.what(), ")");
  }
  MEGATRON_CHECK(vocab.is_array(), where,
                 ": a TikTokenizer vocabulary is a JSON list of {\"rank\", \"token_bytes\", "
                 "\"token_str\"}");
  const int64_t inner = vocab_size - num_special_tokens;
  MEGATRON_CHECK(static_cast<int64_t>(vocab.size()) >= inner, where, " has ", vocab.size(),
                 " tokens, fewer than --vocab-size ", vocab_size,
                 " less --tiktoken-num-special-tokens ", num_special_tokens, " = ", inner,
                 "; pass --vocab-size ", static_cast<int64_t>(vocab.size()) + num_special_tokens,
                 " or less");
  id_bytes_ = special_tokens;
  id_bytes_.reserve(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < inner; ++i) {
    const nlohmann::json& x = vocab[static_cast<size_t>(i)];
    const std::string entry = where + ", entry " + std::to_string(i);
    MEGATRON_CHECK(x.is_object() && x.size() == 3 && x.contains("rank") &&
                       x.contains("token_bytes") && x.contains("token_str"),
                   entry, ": the keys must be exactly rank, token_bytes and token_str");
    MEGATRON_CHECK(x["rank"].is_number_integer() && x["rank"].get<int64_t>() == i, entry, ": rank ",
                   x["rank"].dump(), " where ", i, " is expected (ranks in order)");
    MEGATRON_CHECK(x["token_bytes"].is_string(), entry, ": token_bytes must be a base64 string");
    std::string bytes = base64_decode(x["token_bytes"].get<std::string>(), entry);
    MEGATRON_CHECK(i >= 256 || (bytes.size() == 1 && static_cast<unsigned char>(bytes[0]) == i),
                   entry, ": the first 256 tokens must be the single bytes 0..255 in order");
    id_bytes_.push_back(std::move(bytes));
  }
  // Views into id_bytes_, which no longer grows.
  for (int64_t id = num_special_tokens; id < vocab_size; ++id) {
    const bool fresh = ranks_.emplace(id_bytes_[static_cast<size_t>(id)], id).second;
    MEGATRON_CHECK(fresh, where, ": token ", id - num_special_tokens,
                   " repeats the bytes of an earlier one");
  }
  auto index = [&](const std::string& t) {
    return static_cast<int64_t>(std::find(special_tokens.begin(), special_tokens.end(), t) -
                                special_tokens.begin());
  };
  unk_ = index("<unk>");
  bos_ = index("<s>");
  eos_ = index("</s>");
  std::string specials;
  for (const std::string& s : special_tokens) specials += s + "\n";
  identity_ = "TikTokenizer/" + pattern + "/" + std::to_string(vocab_size) +
              "/sha256:" + sha256_hex(sha256_hex(text) + sha256_hex(specials));
}

int64_t TikTokenizer::rank_of(std::string_view bytes) const {
  const auto it = ranks_.find(bytes);
  return it == ranks_.end() ? kNoRank : it->second;
}

void TikTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>* ids) const {
  if (const int64_t whole = rank_of(piece); whole != kNoRank) {
    ids->push_back(whole);
    return;
  }
  // tiktoken's byte_pair_merge: parts[i] = (start, rank of the pair starting there); the two
  // sentinels end the list.
  const size_t n = piece.size();
  std::vector<std::pair<size_t, int64_t>> parts;
  parts.reserve(n + 1);
  for (size_t i = 0; i + 1 < n; ++i) parts.emplace_back(i, rank_of(piece.substr(i, 2)));
  parts.emplace_back(n - 1, kNoRank);
  parts.emplace_back(n, kNoRank);
  // The rank of parts[i] merged with parts[i + 1] and parts[i + 2] (evaluated before the merge
  // of parts[i + 1] into parts[i]).
  auto rank_after = [&](size_t i) {
    return i + 3 < parts.size()
               ? rank_of(piece.substr(parts[i].first, parts[i + 3].first - parts[i].first))
               : kNoRank;
  };
  for (;;) {
    size_t best = 0;
    int64_t min = kNoRank;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].second < min) min = parts[i].second, best = i;  // leftmost of the lowest
    if (min == kNoRank) break;
    if (best > 0) parts[best - 1].second = rank_after(best - 1);
    parts[best].second = rank_after(best);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int64_t id = rank_of(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first));
    MEGATRON_ASSERT(id != kNoRank, "byte-pair merge left a part outside the vocabulary");
    ids->push_back(id);
  }
}

std::vector<int64_t> TikTokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {  // as a Python str would hold it
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  regex_.for_each_match(
      text, [&](size_t begin, size_t end) { encode_piece(text.substr(begin, end - begin), &ids); });
  return ids;
}

std::string TikTokenizer::decode(std::span<const int64_t> ids) const {
  std::string bytes;
  for (const int64_t id : ids) {
    MEGATRON_CHECK(id >= 0 && id < vocab_size(), "TikTokenizer: token id ", id,
                   " is outside the vocabulary [0, ", vocab_size(), ")");
    bytes += id_bytes_[static_cast<size_t>(id)];
  }
  return is_valid_utf8(bytes) ? bytes : replace_invalid_utf8(bytes);
}

SpecialTokens TikTokenizer::special_tokens() const {
  SpecialTokens s;
  s.bos = bos_;
  s.eos = eos_;
  return s;
}

std::string TikTokenizer::piece(int64_t id) const {
  MEGATRON_CHECK(id >= 0 && id < vocab_size(), "TikTokenizer: token id ", id,
                 " is outside the vocabulary [0, ", vocab_size(), ")");
  return id_bytes_[static_cast<size_t>(id)];
}

}  // namespace megatron
