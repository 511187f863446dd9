// The unified hybrid pattern's grammar: '|' pipeline segments in the main part, '/' MTP depths.
#include "transformer/mamba/hybrid_pattern.h"

#include "core/error.h"

namespace megatron {

namespace {

// Megatron's _validate_pattern: known symbols only, and no standard attention beside MLA/DSA.
void check_symbols(const std::string& part, const std::string& what, const std::string& text,
                   const std::string& flag) {
  for (char c : part) {
    if (c == 'M' || c == '*' || c == '-' || c == 'E' || (c == '|' && what == "main")) continue;
    const std::string s(1, c);
    MEGATRON_CHECK(c != 'G' && c != 'D' && c != '+', flag, " '", text, "': layer symbol '", s,
                   "' (",
                   c == 'G'   ? "gated DeltaNet"
                   : c == 'D' ? "DeepSeek sparse attention"
                              : "MLA",
                   ") is not implemented here; the symbols are M (Mamba), * (attention), - (MLP) "
                   "and E (Mixture of Experts)");
    MEGATRON_CHECK(c != '|', flag, " '", text,
                   "': '|' separates pipeline segments of the main pattern, not of the MTP "
                   "pattern after '/'");
    MEGATRON_CHECK(false, flag, " '", text, "': '", s, "' in the ", what,
                   " pattern is not a layer symbol; use M (Mamba), * (attention), - (MLP), E "
                   "(Mixture of Experts), '|' between pipeline segments and '/' before each MTP "
                   "depth's pattern");
  }
}

}  // namespace

HybridPattern parse_hybrid_pattern(const std::string& text, const std::string& flag) {
  HybridPattern p;
  std::vector<std::string> parts{""};
  for (char c : text) {
    if (c == '/') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  const std::string& main = parts.front();
  check_symbols(main, "main", text, flag);
  p.segments.push_back(0);
  for (char c : main) {
    if (c == '|') {
      p.segments.push_back(0);
    } else {
      p.main += c;
      ++p.segments.back();
    }
  }
  bool any_mtp = false;
  for (size_t i = 1; i < parts.size(); ++i) any_mtp = any_mtp || !parts[i].empty();
  if (!any_mtp) return p;  // "M*M*" or "M*M*/": no MTP (Megatron's rule)
  for (size_t i = 2; i < parts.size(); ++i) {
    MEGATRON_CHECK(parts[i] == parts[1], flag, " '", text,
                   "': all MTP patterns must be identical; pattern 1 is '", parts[1],
                   "', but pattern ", i, " is '", parts[i], "'");
  }
  check_symbols(parts[1], "MTP", text, flag);
  p.mtp = parts[1];
  p.mtp_depths = static_cast<int64_t>(parts.size()) - 1;
  return p;
}

std::string with_legacy_mtp_pattern(const std::string& pattern, const std::string& mtp_pattern,
                                    int64_t mtp_num_layers) {
  if (mtp_pattern.empty() || mtp_num_layers <= 0 || pattern.find('/') != std::string::npos)
    return pattern;
  std::string out = pattern;
  for (int64_t k = 0; k < mtp_num_layers; ++k) out += "/" + mtp_pattern;
  return out;
}

}  // namespace megatron
