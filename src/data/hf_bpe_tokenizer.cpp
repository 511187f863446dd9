// HuggingFace tokenizer.json (byte-level BPE): the loader, which refuses what it cannot reproduce,
// and the encode path: added tokens -> pre-tokenizer steps -> byte-level BPE -> post-processor.
#include "data/hf_bpe_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron {

namespace {

using nlohmann::json;

// Unicode White_Space (Rust's char::is_whitespace, which HF's lstrip/rstrip use).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Code point of the (valid) UTF-8 character starting at s[i]; *len receives its byte length.
uint32_t code_point_at(std::string_view s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

// Start of the UTF-8 character that ends just before byte i.
size_t previous_char_start(std::string_view s, size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

// Escapes a literal string for PCRE2 (a backslash before every non-alphanumeric ASCII character).
std::string regex_escape(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

std::string type_of(const json& node) {
  if (node.is_object() && node.contains("type") && node["type"].is_string()) {
    return node["type"].get<std::string>();
  }
  return "(no type)";
}

bool flag_or(const json& node, const char* key, bool fallback) {
  if (!node.contains(key) || node[key].is_null()) return fallback;
  return node[key].get<bool>();
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path, bool include_special_tokens)
    : path_(path), include_special_tokens_(include_special_tokens) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path_ = (fs::path(path) / "tokenizer.json").string();
  const std::string text = read_tokenizer_file(path_, "--tokenizer-model");
  const std::string& file = path_;
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    MEGATRON_CHECK(false, "--tokenizer-model ", file, ": not valid JSON (", e.what(),
                   "); HuggingFaceTokenizer needs a tokenizer.json");
  }
  MEGATRON_CHECK(root.is_object() && root.contains("model"), "--tokenizer-model ", file,
                 ": no \"model\" section; HuggingFaceTokenizer needs a HuggingFace tokenizer.json");
  try {
    // ---- model
    const json& model = root["model"];
    const std::string model_type = model.value("type", model.contains("merges") ? "BPE" : "");
    MEGATRON_CHECK(model_type == "BPE", file, ": model type \"", model_type,
                   "\" is not supported; HuggingFaceTokenizer implements byte-level BPE only");
    MEGATRON_CHECK(!model.contains("dropout") || model["dropout"].is_null() ||
                       model["dropout"].get<double>() == 0.0,
                   file,
                   ": model.dropout is set; BPE dropout is a training-time option, remove it");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      MEGATRON_CHECK(
          !model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(),
          file, ": model.", key, " is not supported (byte-level BPE does not use it)");
    }
    MEGATRON_CHECK(!flag_or(model, "byte_fallback", false), file,
                   ": model.byte_fallback is not supported (only byte-level BPE is)");
    MEGATRON_CHECK(model.contains("vocab") && model["vocab"].is_object(), file,
                   ": model.vocab must be an object token -> id");
    std::unordered_map<std::string, int64_t> vocab;
    vocab.reserve(model["vocab"].size());
    for (const auto& [token, id] : model["vocab"].items()) vocab.emplace(token, id.get<int64_t>());
    // Two spellings: "a b" strings (tokenizers < 0.20) and ["a", "b"] pairs (>= 0.20).
    std::vector<std::pair<std::string, std::string>> merges;
    MEGATRON_CHECK(model.contains("merges") && model["merges"].is_array(), file,
                   ": model.merges is missing; a BPE model needs its merge list");
    for (const json& merge : model["merges"]) {
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        MEGATRON_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                       file, ": merge \"", s, "\" is not two tokens separated by one space");
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else {
        MEGATRON_CHECK(merge.is_array() && merge.size() == 2, file, ": merge ", merge.dump(),
                       " is neither \"a b\" nor [\"a\", \"b\"]");
        merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      }
    }
    MEGATRON_CHECK(!merges.empty(), file,
                   ": model.merges is empty; a BPE tokenizer without merges would emit one token "
                   "per byte (is the file truncated or converted wrongly?)");
    const bool ignore_merges = flag_or(model, "ignore_merges", false);

    // ---- normalizer
    const json normalizer = root.value("normalizer", json());
    MEGATRON_CHECK(normalizer.is_null() || (type_of(normalizer) == "Sequence" &&
                                            normalizer.value("normalizers", json::array()).empty()),
                   file, ": normalizer ", type_of(normalizer),
                   " is not supported (HuggingFaceTokenizer supports byte-level BPE files without "
                   "a normalizer)");

    // ---- pre_tokenizer, flattened
    std::vector<json> pre;
    const json pre_root = root.value("pre_tokenizer", json());
    if (type_of(pre_root) == "Sequence") {
      for (const json& p : pre_root.value("pretokenizers", json::array())) pre.push_back(p);
    } else if (!pre_root.is_null()) {
      pre.push_back(pre_root);
    }
    bool has_byte_level = false;
    for (const json& p : pre) {
      const std::string type = type_of(p);
      Step step;
      if (type == "ByteLevel") {
        MEGATRON_CHECK(p.contains("add_prefix_space"), file,
                       ": pre_tokenizer ByteLevel lacks add_prefix_space");
        step.byte_level = true;
        step.add_prefix_space = p["add_prefix_space"].get<bool>();
        if (flag_or(p, "use_regex", true)) {
          step.regex = std::make_unique<PreTokenizerRegex>(kGpt2Pattern, file);
        }
        has_byte_level = true;
      } else if (type == "Split") {
        const json& pattern = p.at("pattern");
        std::string regex;
        if (pattern.contains("Regex")) {
          regex = pattern["Regex"].get<std::string>();
        } else {
          MEGATRON_CHECK(pattern.contains("String"), file,
                         ": pre_tokenizer Split pattern must be {\"Regex\": ...} or {\"String\": "
                         "...}, got ",
                         pattern.dump());
          regex = regex_escape(pattern["String"].get<std::string>());
        }
        const std::string behavior = p.value("behavior", "");
        MEGATRON_CHECK(behavior == "Isolated" || behavior == "Removed", file,
                       ": pre_tokenizer Split behavior \"", behavior,
                       "\" is not supported (Isolated and Removed are)");
        MEGATRON_CHECK(!flag_or(p, "invert", false), file,
                       ": pre_tokenizer Split with invert=true is not supported");
        step.remove_matches = behavior == "Removed";
        step.regex = std::make_unique<PreTokenizerRegex>(regex, file);
      } else {
        MEGATRON_CHECK(false, file, ": pre_tokenizer ", type,
                       " is not supported (ByteLevel, Split, Sequence are)");
      }
      steps_.push_back(std::move(step));
    }
    MEGATRON_CHECK(has_byte_level, file,
                   ": the pre_tokenizer has no ByteLevel step; HuggingFaceTokenizer implements "
                   "byte-level BPE only");

    // ---- decoder
    const json decoder = root.value("decoder", json());
    bool decoder_ok = type_of(decoder) == "ByteLevel";
    if (type_of(decoder) == "Sequence") {
      const json members = decoder.value("decoders", json::array());
      decoder_ok =
          !members.empty() && std::all_of(members.begin(), members.end(),
                                          [](const json& d) { return type_of(d) == "ByteLevel"; });
    }
    MEGATRON_CHECK(decoder_ok, file, ": decoder ", decoder.is_null() ? "null" : type_of(decoder),
                   " is not supported (ByteLevel is)");

    // ---- added tokens
    for (const json& t : root.value("added_tokens", json::array())) {
      AddedToken token;
      token.content = t.at("content").get<std::string>();
      token.id = t.at("id").get<int64_t>();
      token.lstrip = flag_or(t, "lstrip", false);
      token.rstrip = flag_or(t, "rstrip", false);
      token.normalized = flag_or(t, "normalized", true);
      token.special = flag_or(t, "special", false);
      MEGATRON_CHECK(!flag_or(t, "single_word", false), file, ": added token \"", token.content,
                     "\" has single_word=true, which is not supported");
      MEGATRON_CHECK(!token.content.empty() && token.id >= 0, file, ": added token ", t.dump(),
                     " needs a non-empty content and an id >= 0");
      added_content_[token.id] = token.content;
      if (token.special) special_ids_.insert(token.id);
      added_.push_back(std::move(token));
    }
    added_by_first_byte_.resize(256);
    for (size_t i = 0; i < added_.size(); ++i) {
      added_by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
    }
    for (auto& bucket : added_by_first_byte_) {
      std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
        return added_[a].content.size() > added_[b].content.size();
      });
    }

    bpe_ = std::make_unique<ByteLevelBpe>(std::move(vocab), merges, ignore_merges, file);
    auto id_of = [&](const std::string& token) -> int64_t {
      for (const AddedToken& t : added_) {
        if (t.content == token) return t.id;
      }
      return bpe_->token_id(token);
    };

    // ---- post_processor
    std::vector<json> post;
    const json post_root = root.value("post_processor", json());
    if (type_of(post_root) == "Sequence") {
      for (const json& p : post_root.value("processors", json::array())) post.push_back(p);
    } else if (!post_root.is_null()) {
      post.push_back(post_root);
    }
    for (const json& p : post) {
      const std::string type = type_of(p);
      if (type == "ByteLevel") continue;  // offsets only
      if (type == "TemplateProcessing") {
        bool seen_sequence = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            MEGATRON_CHECK(!seen_sequence, file,
                           ": post_processor template uses the sequence twice; not supported");
            seen_sequence = true;
            continue;
          }
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          const json& special = p.at("special_tokens").at(name);
          for (const json& id : special.at("ids")) {
            (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(id.get<int64_t>());
          }
        }
      } else if (type == "RobertaProcessing" || type == "BertProcessing") {
        prefix_ids_.push_back(p.at("cls").at(1).get<int64_t>());
        suffix_ids_.push_back(p.at("sep").at(1).get<int64_t>());
      } else {
        MEGATRON_CHECK(false, file, ": post_processor ", type,
                       " is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, "
                       "ByteLevel are)");
      }
    }

    // ---- sizes, EOD, identity
    vocab_size_ = bpe_->max_id() + 1;
    for (const AddedToken& t : added_) vocab_size_ = std::max(vocab_size_, t.id + 1);
    const fs::path config_path = fs::path(path_).parent_path() / "tokenizer_config.json";
    std::string config_text;
    if (fs::is_regular_file(config_path, ec)) {
      config_text = read_tokenizer_file(config_path.string(), "--tokenizer-model (its config)");
      const json config = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
      // A special token of the config: a string or {"content": ...}; null or absent: none.
      auto token_named = [&](const char* key) -> int64_t {
        if (!config.is_object() || !config.contains(key)) return -1;
        const json& v = config[key];
        const std::string name = v.is_string() ? v.get<std::string>()
                                 : v.is_object() && v.contains("content")
                                     ? v["content"].get<std::string>()
                                     : std::string();
        return name.empty() ? -1 : id_of(name);
      };
      eod_ = token_named("eos_token");
      // Megatron core 0.19's HuggingFaceTokenizer.pad_id: transformers' pad_token.
      pad_ = token_named("pad_token");
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
      if (eod_ < 0) eod_ = id_of(name);
    }
    identity_ = "HuggingFaceTokenizer/sha256:" +
                (config_text.empty() ? sha256_hex(text)
                                     : sha256_hex(sha256_hex(text) + sha256_hex(config_text)));
  } catch (const json::exception& e) {
    // Wrong field types and missing required fields land here.
    MEGATRON_CHECK(false, "--tokenizer-model ", file, ": malformed tokenizer.json (", e.what(),
                   ")");
  }
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

int64_t HuggingFaceTokenizer::eod() const {
  MEGATRON_CHECK(eod_ >= 0, "--tokenizer-model ", path_,
                 ": no EOD token: tokenizer_config.json beside it names no eos_token, and none of "
                 "<|endoftext|>, <|end_of_text|>, </s>, <eos> is in the vocabulary");
  return eod_;
}

void HuggingFaceTokenizer::split_added_tokens(std::string_view text, bool normalized_pass,
                                              std::vector<Segment>* segments) const {
  std::vector<Segment> out;
  for (const Segment& seg : *segments) {
    if (seg.added_id >= 0 || added_.empty()) {
      out.push_back(seg);
      continue;
    }
    size_t cursor = seg.begin;  // start of the text not yet emitted
    size_t i = seg.begin;
    while (i < seg.end) {
      const AddedToken* hit = nullptr;
      for (const size_t k : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
        const AddedToken& t = added_[k];
        if (t.normalized == normalized_pass && t.content.size() <= seg.end - i &&
            text.compare(i, t.content.size(), t.content) == 0) {
          hit = &t;  // buckets are longest first: leftmost-longest
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + hit->content.size();
      size_t len = 0;
      if (hit->lstrip) {
        while (begin > cursor) {
          const size_t prev = previous_char_start(text, begin);
          if (!is_white_space(code_point_at(text, prev, &len))) break;
          begin = prev;
        }
      }
      if (hit->rstrip) {
        while (end < seg.end && is_white_space(code_point_at(text, end, &len))) end += len;
      }
      if (begin > cursor) out.push_back({-1, cursor, begin});
      out.push_back({hit->id, begin, end});
      cursor = i = end;
    }
    if (cursor < seg.end) out.push_back({-1, cursor, seg.end});
  }
  *segments = std::move(out);
}

void HuggingFaceTokenizer::encode_text(std::string_view piece, size_t step,
                                       std::vector<int64_t>* ids) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    bpe_->encode_piece(piece, ids);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.add_prefix_space && piece[0] != ' ') {
    prefixed = " ";
    prefixed += piece;
    piece = prefixed;
  }
  if (s.regex == nullptr) {
    encode_text(piece, step + 1, ids);
    return;
  }
  size_t gap = 0;
  s.regex->for_each_match(piece, [&](size_t begin, size_t end) {
    encode_text(piece.substr(gap, begin - gap), step + 1, ids);
    if (!s.remove_matches) encode_text(piece.substr(begin, end - begin), step + 1, ids);
    gap = end;
  });
  encode_text(piece.substr(gap), step + 1, ids);
}

std::vector<int64_t> HuggingFaceTokenizer::encode(std::string_view text) const {
  if (!include_special_tokens_) return encode_plain(text);
  std::vector<int64_t> ids(prefix_ids_);
  const std::vector<int64_t> body = encode_plain(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

int64_t HuggingFaceTokenizer::token_to_id(const std::string& token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  return bpe_->token_id(token);
}

std::vector<int64_t> HuggingFaceTokenizer::encode_plain(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Segment> segments{{-1, 0, text.size()}};
  split_added_tokens(text, /*normalized_pass=*/false, &segments);
  split_added_tokens(text, /*normalized_pass=*/true, &segments);
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
    } else {
      encode_text(text.substr(seg.begin, seg.end - seg.begin), 0, &ids);
    }
  }
  return ids;
}

std::string HuggingFaceTokenizer::decode(std::span<const int64_t> ids) const {
  return decode_ids(ids, !include_special_tokens_);
}

std::string HuggingFaceTokenizer::decode_skipping_special(std::span<const int64_t> ids) const {
  return decode_ids(ids, true);
}

std::string HuggingFaceTokenizer::decode_ids(std::span<const int64_t> ids,
                                             bool skip_special) const {
  std::string bytes;
  for (const int64_t id : ids) {
    if (skip_special && special_ids_.count(id)) continue;
    if (const auto it = added_content_.find(id); it != added_content_.end()) {
      bytes += it->second;  // added tokens are stored as text, not byte-mapped
      continue;
    }
    MEGATRON_CHECK(bpe_->append_token_bytes(id, &bytes), "HuggingFaceTokenizer: token id ", id,
                   " is outside the vocabulary [0, ", vocab_size_, ") of ", path_);
  }
  return is_valid_utf8(bytes) ? bytes : replace_invalid_utf8(bytes);
}

}  // namespace megatron
