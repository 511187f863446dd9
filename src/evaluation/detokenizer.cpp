// Megatron's WikiText and PTB detokenizers, rule by rule (detokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "evaluation/detokenizer.h"

#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace megatron::evaluation {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

// Python's re.sub(pattern, replacement, s): every non-overlapping match, left to right; `$1` in
// the replacement is group 1 (Python's \1).
void regex_replace(std::string& s, const char* pattern, const char* replacement) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr),
      &pcre2_code_free);
  MEGATRON_ASSERT(code != nullptr, "detokenizer pattern does not compile: ", pattern);
  std::string out(s.size() + 64, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    PCRE2_SIZE length = out.size();
    const int rc =
        pcre2_substitute(code.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                         PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, nullptr,
                         nullptr, reinterpret_cast<PCRE2_SPTR>(replacement), PCRE2_ZERO_TERMINATED,
                         reinterpret_cast<PCRE2_UCHAR*>(out.data()), &length);
    if (rc == PCRE2_ERROR_NOMEMORY) {
      out.resize(length);  // the length it needs
      continue;
    }
    MEGATRON_CHECK(rc >= 0, "detokenizer: the text is not valid UTF-8 (PCRE2 error ", rc, ")");
    out.resize(length);
    s = std::move(out);
    return;
  }
  MEGATRON_ASSERT(false, "detokenizer: substitution did not fit its measured length");
}

}  // namespace

std::string ptb_detokenize(std::string s) {
  replace_all(s, " '", "'");
  replace_all(s, " \n", "\n");
  replace_all(s, "\n ", "\n");
  replace_all(s, " n't", "n't");
  replace_all(s, " N ", "1 ");
  replace_all(s, "$ 1", "$1");
  replace_all(s, "# 1", "#1");
  return s;
}

std::string wikitext_detokenize(std::string s) {
  // contractions
  replace_all(s, "s '", "s'");
  regex_replace(s, "/' [0-9]/", "/'[0-9]/");
  // number separators
  replace_all(s, " @-@ ", "-");
  replace_all(s, " @,@ ", ",");
  replace_all(s, " @.@ ", ".");
  // punctuation
  replace_all(s, " : ", ": ");
  replace_all(s, " ; ", "; ");
  replace_all(s, " . ", ". ");
  replace_all(s, " ! ", "! ");
  replace_all(s, " ? ", "? ");
  replace_all(s, " , ", ", ");
  // double brackets
  regex_replace(s, R"(\(\s*([^\)]*?)\s*\))", "($1)");
  regex_replace(s, R"(\[\s*([^\]]*?)\s*\])", "[$1]");
  regex_replace(s, R"({\s*([^}]*?)\s*})", "{$1}");
  regex_replace(s, R"("\s*([^"]*?)\s*")", "\"$1\"");
  regex_replace(s, R"('\s*([^']*?)\s*')", "'$1'");
  // miscellaneous
  replace_all(s, "= = = =", "====");
  replace_all(s, "= = =", "===");
  replace_all(s, "= =", "==");
  replace_all(s, " \xC2\xB0 ", "\xC2\xB0");  // chr(176), the degree sign
  replace_all(s, " \n", "\n");
  replace_all(s, "\n ", "\n");
  replace_all(s, " N ", " 1 ");
  replace_all(s, " 's", "'s");
  return s;
}

std::string detokenize_for_path(const std::string& path, const std::string& text,
                                std::string* name) {
  auto says = [&](const char* n) {
    if (name) *name = n;
  };
  if (path.find("ptb") != std::string::npos) {
    says("ptb");
    return ptb_detokenize(text);
  }
  if (path.find("wiki") != std::string::npos) {
    says("wiki");
    return wikitext_detokenize(text);
  }
  says(path.find("lambada") != std::string::npos ? "lambada" : "none");
  return text;
}

}  // namespace megatron::evaluation
