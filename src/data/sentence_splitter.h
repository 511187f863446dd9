// SentenceSplitter: `megatron preprocess --split-sentences`, documents into sentences for BERT and
// T5 data (Megatron's `_text_sentence` datasets: one sequence per sentence, the document
// boundaries kept).
//
// Megatron splits with NLTK's punkt (an unsupervised model of abbreviations and sentence starters
// trained on English). We use ICU's sentence break iterator with the English abbreviation
// suppressions (locale en@ss=standard: "Mr.", "e.g." do not end sentences), the Unicode
// text-segmentation rules (UAX #29) that ICU maintains. Where they differ: ICU breaks at every
// line or paragraph break, punkt only after sentence-ending punctuation; ICU breaks after "?" and
// "!" followed by a lower-case word less often; punkt knows abbreviations learned from its
// corpus, ICU only its list. For WordPiece data the split only moves sentence boundaries (the ids
// of a sentence do not depend on surrounding whitespace).
//
// As preprocess_data.py does: text is cut into pieces of 1,000,000 code points before splitting
// (sentences crossing a cut are cut too); without --keep-newlines each sentence is trimmed of the
// whitespace around it (punkt's sentences end at their punctuation), with it each sentence keeps
// the whitespace that follows it, newlines included (Megatron's CustomLanguageVars), so the
// sentences concatenate back to the text. Whitespace-only pieces are not sentences.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <unicode/uversion.h>  // ICU's versioned namespace, for the declaration below

U_NAMESPACE_BEGIN
class BreakIterator;
U_NAMESPACE_END

namespace megatron {

class SentenceSplitter {
 public:
  explicit SentenceSplitter(bool keep_newlines);
  ~SentenceSplitter();
  SentenceSplitter(const SentenceSplitter&) = delete;
  SentenceSplitter& operator=(const SentenceSplitter&) = delete;

  // UTF-8 text (invalid bytes replaced by U+FFFD first) -> its sentences, in order. Safe to call
  // from several threads at once.
  std::vector<std::string> split(std::string_view text) const;

 private:
  bool keep_newlines_;
  std::unique_ptr<icu::BreakIterator> prototype_;  // cloned per call (iterators hold state)
};

}  // namespace megatron
