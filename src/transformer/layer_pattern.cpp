// Recursive descent over Megatron's per-layer list expressions: see the header.
#include "transformer/layer_pattern.h"

#include <cctype>
#include <cstdint>

#include "core/error.h"

namespace megatron {

namespace {

// Recursive descent over Megatron's list expressions: sum := term ('+' term)*; term := atom
// ('*' int)?; atom := '[' int (',' int)* ']' | '(' sum ')'.
class PatternParser {
 public:
  PatternParser(const std::string& s, const std::string& flag, const std::string& entries)
      : s_(s), flag_(flag), entries_(entries) {}

  std::vector<int> parse() {
    std::vector<int> v = sum();
    skip();
    expect(pos_ == s_.size(), "unexpected text");
    return v;
  }

 private:
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(bool ok, const char* what) const {
    MEGATRON_CHECK(ok, flag_, " '", s_, "': ", what, " at character ", pos_,
                   "; give an integer N or a list expression such as ([0]*3+[1]*5)");
  }
  int64_t integer() {
    skip();
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    expect(pos_ > start, "expected a number");
    return std::stoll(s_.substr(start, pos_ - start));
  }
  std::vector<int> sum() {
    std::vector<int> v = term();
    while (eat('+')) {
      std::vector<int> t = term();
      v.insert(v.end(), t.begin(), t.end());
    }
    return v;
  }
  std::vector<int> term() {
    std::vector<int> a = atom();
    if (!eat('*')) return a;
    const int64_t n = integer();
    std::vector<int> v;
    for (int64_t i = 0; i < n; ++i) v.insert(v.end(), a.begin(), a.end());
    return v;
  }
  std::vector<int> atom() {
    if (eat('(')) {
      std::vector<int> v = sum();
      expect(eat(')'), "expected ')'");
      return v;
    }
    expect(eat('['), "expected '[' or '('");
    std::vector<int> v;
    do {
      const int64_t x = integer();
      MEGATRON_CHECK(x == 0 || x == 1, flag_, " '", s_, "': entries must be ", entries_);
      v.push_back(static_cast<int>(x));
    } while (eat(','));
    expect(eat(']'), "expected ']'");
    return v;
  }

  const std::string& s_;
  const std::string& flag_;
  const std::string& entries_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<int> parse_layer_pattern(const std::string& text, const std::string& flag,
                                     const std::string& entries) {
  return PatternParser(text, flag, entries).parse();
}

LayerFreq parse_layer_freq(const std::string& text, int64_t num_layers, const std::string& flag,
                           const std::string& entries) {
  LayerFreq out;
  if (text.find('[') != std::string::npos) {
    out.pattern = parse_layer_pattern(text, flag, entries);
    MEGATRON_CHECK(static_cast<int64_t>(out.pattern.size()) == num_layers, flag, " '", text,
                   "' has ", out.pattern.size(), " entries but --num-layers is ", num_layers,
                   "; the pattern needs one 0/1 per layer");
    return out;
  }
  try {
    size_t used = 0;
    out.every = std::stoll(text, &used);
    MEGATRON_CHECK(used == text.size(), "");
  } catch (const std::exception&) {
    MEGATRON_CHECK(false, flag, " '", text,
                   "' is neither an integer nor a list expression such as ([0]*3+[1])*3");
  }
  MEGATRON_CHECK(out.every >= 0, flag, " must be >= 0, got ", out.every);
  return out;
}

std::vector<int> parse_no_rope_freq(const std::string& text, int64_t num_layers) {
  LayerFreq f = parse_layer_freq(text, num_layers, "--no-rope-freq", "0 (RoPE) or 1 (no RoPE)");
  if (!f.pattern.empty() || f.every == 0) return f.pattern;  // 0: off (Megatron's falsy value)
  MEGATRON_CHECK(num_layers % f.every == 0, "--no-rope-freq ", f.every,
                 " should divide --num-layers (", num_layers, ")");
  std::vector<int> out;
  for (int64_t i = 0; i < num_layers; ++i) out.push_back((i + 1) % f.every == 0 ? 1 : 0);
  return out;
}

std::vector<int> parse_window_attn_skip_freq(const std::string& text, int64_t num_layers) {
  LayerFreq f = parse_layer_freq(text, num_layers, "--window-attn-skip-freq",
                                 "0 (full attention) or 1 (sliding window)");
  if (!f.pattern.empty()) return f.pattern;
  MEGATRON_CHECK(f.every > 0,
                 "--window-attn-skip-freq must be a positive integer or a list, "
                 "got ",
                 text);
  std::vector<int> out;
  for (int64_t i = 0; i < num_layers; ++i) out.push_back((i + 1) % f.every != 0 ? 1 : 0);
  return out;
}

}  // namespace megatron
