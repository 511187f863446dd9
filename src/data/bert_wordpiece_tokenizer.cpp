#include "data/bert_wordpiece_tokenizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"  // is_valid_utf8, replace_invalid_utf8, sha256_hex

namespace megatron {

namespace {

// Megatron's WordpieceTokenizer.max_input_chars_per_word.
constexpr size_t kMaxWordChars = 200;

bool is_whitespace(UChar32 c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType(c) == U_SPACE_SEPARATOR;
}

bool is_control(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int8_t t = u_charType(c);
  return t == U_CONTROL_CHAR || t == U_FORMAT_CHAR;
}

bool is_punctuation(UChar32 c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0;
}

// The CJK Unified Ideographs blocks BERT spaces out (not Hangul, Hiragana or Katakana).
bool is_cjk(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// What Python's str.split() splits on among the characters cleaning leaves: the space, and the
// line and paragraph separators (Zl, Zp), which are neither Zs nor control characters.
bool splits_words(UChar32 c) {
  return c == ' ' || c == 0x2028 || c == 0x2029;
}

std::u32string to_u32(std::string_view utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  const auto* s = reinterpret_cast<const uint8_t*>(utf8.data());
  const int32_t n = static_cast<int32_t>(utf8.size());
  for (int32_t i = 0; i < n;) {
    UChar32 c;
    U8_NEXT(s, i, n, c);
    out.push_back(static_cast<char32_t>(c < 0 ? 0xFFFD : c));
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  uint8_t buf[4];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, static_cast<UChar32>(c));
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string to_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// Python's str.lower(): ICU's full, language-independent lower-casing (final sigma included).
std::u32string lower(const std::u32string& s) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(s.data()),
                                                       static_cast<int32_t>(s.size()));
  u.toLower(icu::Locale::getRoot());
  std::u32string out(static_cast<size_t>(u.countChar32()), U'\0');
  UErrorCode status = U_ZERO_ERROR;
  u.toUTF32(reinterpret_cast<UChar32*>(out.data()), static_cast<int32_t>(out.size()), status);
  MEGATRON_CHECK(U_SUCCESS(status), "BERT tokenizer: lower-casing failed (", u_errorName(status),
                 ")");
  return out;
}

// NFD, then every non-spacing mark (Mn) dropped.
std::u32string strip_accents(const std::u32string& s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  MEGATRON_CHECK(U_SUCCESS(status), "BERT tokenizer: ICU's NFD data is missing (",
                 u_errorName(status), ")");
  const icu::UnicodeString u = icu::UnicodeString::fromUTF32(
      reinterpret_cast<const UChar32*>(s.data()), static_cast<int32_t>(s.size()));
  const icu::UnicodeString d = nfd->normalize(u, status);
  MEGATRON_CHECK(U_SUCCESS(status), "BERT tokenizer: NFD failed (", u_errorName(status), ")");
  std::u32string out;
  out.reserve(static_cast<size_t>(d.length()));
  for (int32_t i = 0; i < d.length();) {
    const UChar32 c = d.char32At(i);
    if (u_charType(c) != U_NON_SPACING_MARK) out.push_back(static_cast<char32_t>(c));
    i += U16_LENGTH(c);
  }
  return out;
}

// Python's str.replace(from, to): every non-overlapping occurrence, left to right.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = s.find(from, pos)) != std::string::npos; pos = at + from.size()) {
    out.append(s, pos, at - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1c && c <= 0x1f);
}

}  // namespace

BertWordPieceTokenizer::BertWordPieceTokenizer(const std::string& type,
                                               const std::string& vocab_file,
                                               int64_t vocab_extra_ids)
    : type_(type), vocab_file_(vocab_file), lower_case_(type == "BertWordPieceLowerCase") {
  MEGATRON_CHECK(type == "BertWordPieceLowerCase" || type == "BertWordPieceCase",
                 "--tokenizer-type ", type, " is not a WordPiece tokenizer");
  MEGATRON_CHECK(vocab_extra_ids >= 0, "--vocab-extra-ids is ", vocab_extra_ids, ", expected >= 0");
  std::ifstream in(vocab_file, std::ios::binary);
  MEGATRON_CHECK(in.good(), "--vocab-file ", vocab_file, ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  MEGATRON_CHECK(is_valid_utf8(text), "--vocab-file ", vocab_file,
                 ": not UTF-8; a WordPiece vocab.txt holds one UTF-8 token per line");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    // Python's readline + strip(): surrounding whitespace is not part of the token.
    size_t b = pos, e = end;
    while (b < e && is_ascii_space(text[b])) ++b;
    while (e > b && is_ascii_space(text[e - 1])) --e;
    std::string token = text.substr(b, e - b);
    const int64_t id = static_cast<int64_t>(pieces_.size());
    const auto [it, inserted] = vocab_.emplace(token, id);
    MEGATRON_CHECK(inserted, "--vocab-file ", vocab_file, ": token '", token, "' on line ", id + 1,
                   " repeats line ", it->second + 1,
                   "; each token must appear once (ids are line numbers)");
    pieces_.push_back(std::move(token));
    pos = end + 1;
  }
  MEGATRON_CHECK(!pieces_.empty(), "--vocab-file ", vocab_file, ": empty vocabulary");
  unk_ = id_of("[UNK]", "WordPiece's unknown token");
  special_.cls = id_of("[CLS]", "BERT's sequence start");
  special_.sep = id_of("[SEP]", "BERT's segment end");
  special_.pad = id_of("[PAD]", "BERT's padding");
  special_.mask = id_of("[MASK]", "masked-LM's mask token");
  // Megatron's _BertWordPieceTokenizer appends these when missing, in this order.
  auto add = [&](const std::string& token) {
    auto it = vocab_.find(token);
    if (it != vocab_.end()) return it->second;
    const int64_t id = static_cast<int64_t>(pieces_.size());
    vocab_.emplace(token, id);
    pieces_.push_back(token);
    return id;
  };
  special_.bos = add("[BOS]");
  special_.eos = add("[EOS]");
  for (int64_t i = 0; i < vocab_extra_ids; ++i)
    special_.additional.push_back(add("<extra_id_" + std::to_string(i) + ">"));
  for (const std::string& p : pieces_)
    max_piece_chars_ = std::max(max_piece_chars_, to_u32(p).size());
  identity_ = type + "/sha256:" + sha256_hex(text) +
              (vocab_extra_ids ? "/extra_ids:" + std::to_string(vocab_extra_ids) : "");
}

int64_t BertWordPieceTokenizer::id_of(const std::string& token, const char* why) const {
  auto it = vocab_.find(token);
  MEGATRON_CHECK(it != vocab_.end(), "--vocab-file ", vocab_file_, " has no ", token, " (", why,
                 "); use a BERT WordPiece vocab.txt, which lists [PAD], [UNK], [CLS], [SEP] "
                 "and [MASK]");
  return it->second;
}

std::string BertWordPieceTokenizer::piece(int64_t id) const {
  MEGATRON_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary [0, ",
                 vocab_size(), ") of --vocab-file ", vocab_file_);
  return pieces_[static_cast<size_t>(id)];
}

std::vector<std::string> BertWordPieceTokenizer::basic_tokens(std::string_view text) const {
  const std::string valid = is_valid_utf8(text) ? std::string(text) : replace_invalid_utf8(text);
  const std::u32string chars = to_u32(valid);
  // Clean, space out CJK ideographs, split on whitespace.
  std::vector<std::u32string> words(1);
  for (char32_t c : chars) {
    const auto u = static_cast<UChar32>(c);
    if (u == 0 || u == 0xFFFD || is_control(u)) continue;
    if (is_whitespace(u) || splits_words(u) || is_cjk(u)) {
      if (!words.back().empty()) words.emplace_back();
      if (is_cjk(u)) {
        words.back().push_back(c);
        words.emplace_back();
      }
      continue;
    }
    words.back().push_back(c);
  }
  std::vector<std::string> out;
  for (std::u32string& w : words) {
    if (w.empty()) continue;
    if (lower_case_) w = strip_accents(lower(w));
    // Every punctuation character becomes a word of its own.
    std::u32string run;
    for (char32_t c : w) {
      if (is_punctuation(static_cast<UChar32>(c))) {
        if (!run.empty()) out.push_back(to_utf8(run));
        run.clear();
        out.push_back(to_utf8(std::u32string(1, c)));
      } else {
        run.push_back(c);
      }
    }
    if (!run.empty()) out.push_back(to_utf8(run));
  }
  return out;
}

void BertWordPieceTokenizer::wordpiece(const std::u32string& word,
                                       std::vector<int64_t>& out) const {
  if (word.size() > kMaxWordChars) {
    out.push_back(unk_);
    return;
  }
  // UTF-8 offset of each code point, so candidates are byte slices of one string.
  std::string utf8;
  std::vector<size_t> offset;
  for (char32_t c : word) {
    offset.push_back(utf8.size());
    append_utf8(utf8, c);
  }
  offset.push_back(utf8.size());
  const size_t first = out.size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    size_t end = std::min(word.size(), start + max_piece_chars_);
    int64_t id = -1;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(utf8, offset[start], offset[end] - offset[start]);
      auto it = vocab_.find(candidate);
      if (it != vocab_.end()) {
        id = it->second;
        break;
      }
    }
    if (id < 0) {  // no piece fits here: the whole word is unknown
      out.resize(first);
      out.push_back(unk_);
      return;
    }
    out.push_back(id);
    start = end;
  }
}

std::vector<int64_t> BertWordPieceTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const std::string& w : basic_tokens(text)) wordpiece(to_u32(w), ids);
  return ids;
}

std::string BertWordPieceTokenizer::decode(std::span<const int64_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) text += ' ';
    text += piece(ids[i]);
  }
  replace_all(text, " ##", "");
  const size_t b = text.find_first_not_of(" \t\n\r");
  text = b == std::string::npos ? "" : text.substr(b, text.find_last_not_of(" \t\n\r") - b + 1);
  for (const auto& [from, to] : {std::pair<const char*, const char*>{" .", "."},
                                 {" ?", "?"},
                                 {" !", "!"},
                                 {" ,", ","},
                                 {" ' ", "'"},
                                 {" n't", "n't"},
                                 {" 'm", "'m"},
                                 {" 's", "'s"},
                                 {" 've", "'ve"},
                                 {" 're", "'re"}})
    replace_all(text, from, to);
  return text;
}

}  // namespace megatron
