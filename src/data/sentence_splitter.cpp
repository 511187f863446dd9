#include "data/sentence_splitter.h"

#include <unicode/brkiter.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"  // is_valid_utf8, replace_invalid_utf8

namespace megatron {

namespace {

// preprocess_data.py splits text[i : i + max_len] for max_len = 1,000,000 characters.
constexpr int64_t kPieceChars = 1000000;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

SentenceSplitter::SentenceSplitter(bool keep_newlines) : keep_newlines_(keep_newlines) {
  UErrorCode status = U_ZERO_ERROR;
  prototype_.reset(
      icu::BreakIterator::createSentenceInstance(icu::Locale("en@ss=standard"), status));
  MEGATRON_CHECK(U_SUCCESS(status) && prototype_,
                 "--split-sentences: ICU's sentence rules are "
                 "missing (",
                 u_errorName(status), "); install libicu (scripts/setup.sh)");
}

SentenceSplitter::~SentenceSplitter() = default;

std::vector<std::string> SentenceSplitter::split(std::string_view input) const {
  const std::string owned = is_valid_utf8(input) ? std::string() : replace_invalid_utf8(input);
  const std::string_view text = owned.empty() ? input : std::string_view(owned);
  std::unique_ptr<icu::BreakIterator> it(prototype_->clone());
  std::vector<std::string> out;
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const auto n = static_cast<int64_t>(text.size());
  for (int64_t begin = 0; begin < n;) {
    // The next piece: up to kPieceChars code points.
    int64_t end = begin;
    for (int64_t chars = 0; end < n && chars < kPieceChars; ++chars)
      end += U8_COUNT_TRAIL_BYTES(bytes[end]) + 1;
    const std::string_view piece =
        text.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    UErrorCode status = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, piece.data(), static_cast<int64_t>(piece.size()), &status);
    MEGATRON_CHECK(U_SUCCESS(status), "--split-sentences: ICU cannot read the text (",
                   u_errorName(status), ")");
    it->setText(ut, status);
    MEGATRON_CHECK(U_SUCCESS(status), "--split-sentences: ICU cannot segment the text (",
                   u_errorName(status), ")");
    // Boundaries are UTF-8 byte offsets into the piece (UText's native indices). ICU ends a
    // segment at every line break, so a blank line is a whitespace-only segment of its own:
    // kept, it joins the sentence before it (or the first one after, at the start).
    std::string pending;
    const size_t piece_first = out.size();
    for (int32_t a = it->first(), b = it->next(); b != icu::BreakIterator::DONE;
         a = b, b = it->next()) {
      const std::string_view sentence =
          piece.substr(static_cast<size_t>(a), static_cast<size_t>(b - a));
      if (trim(sentence).empty()) {
        if (!keep_newlines_) continue;
        if (out.size() > piece_first) {
          out.back() += sentence;
        } else {
          pending += sentence;
        }
        continue;
      }
      out.push_back(keep_newlines_ ? pending + std::string(sentence) : std::string(trim(sentence)));
      pending.clear();
    }
    utext_close(ut);
    begin = end;
  }
  return out;
}

}  // namespace megatron
