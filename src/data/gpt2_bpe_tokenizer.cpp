// GPT-2 byte-level BPE: UTF-8 repair, the PCRE2 pre-tokenizer, the merge loop and its cache, and
// the encoder.json / vocab.bpe loader. See the header for the rules each part follows.
#include "data/gpt2_bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <openssl/evp.h>
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.h"

namespace megatron {

// ---------------------------------------------------------------------------------------------
// UTF-8

namespace {

// Length of the well-formed sequence at s[i] (> 0), or minus the length of its maximal ill-formed
// subpart (< 0). The accepted second-byte ranges are those of Unicode's Table 3-7, so surrogates
// (ED A0..BF), overlong forms (C0, C1, E0 80..9F, F0 80..8F) and values past U+10FFFF are refused
// at the first byte that proves them bad, as the WHATWG decoder does.
int utf8_step(const unsigned char* s, size_t n, size_t i) {
  const unsigned c = s[i];
  if (c < 0x80) return 1;
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return -k;
    const unsigned b = s[i + k];
    if (b < lo || b > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs dominate real text: test 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const int len = utf8_step(s, n, i);
    if (len < 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    const int len = utf8_step(s, n, i);
    if (len > 0) {
      out.append(text.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out.append(kReplacement);
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Files and digests

std::string read_tokenizer_file(const std::string& path, std::string_view flag) {
  MEGATRON_CHECK(!path.empty(), flag, " is empty: pass the path of the tokenizer file");
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), flag, " ", path, ": cannot open the file (missing or unreadable); ",
                 "pass an existing file");
  std::ostringstream buf;
  buf << in.rdbuf();
  MEGATRON_CHECK(!in.bad(), flag, " ", path, ": read error");
  return std::move(buf).str();
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const int ok = EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  MEGATRON_ASSERT(ok == 1, "EVP_Digest(sha256) failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 pre-tokenizer

namespace {

// Unicode White_Space, the meaning of \s in Python `regex`, Rust `regex` and Oniguruma. PCRE2's
// UCP \s adds U+180E (no longer a space since Unicode 6.3); JavaScript's \s adds U+FEFF and drops
// U+0085.
constexpr std::string_view kWhiteSpaceMembers =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A})"
    R"(\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s (and \S outside character classes) to explicit White_Space classes. Only escapes and
// character-class brackets are tracked: that is all the rewrite needs to know about the syntax.
std::string expand_white_space(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  const size_t n = p.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < n) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceMembers;
        } else {
          out += '[';
          out += kWhiteSpaceMembers;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceMembers;
        out += ']';
      } else if (e == 'Q') {  // \Q...\E quotes literally: copy it untouched.
        const size_t close = p.find("\\E", i + 1);
        const size_t stop = close == std::string_view::npos ? n : close + 2;
        out += p.substr(i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < n && p[i + 1] == '^') out += p[++i];
      if (i + 1 < n && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {  // POSIX [:name:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out += p.substr(i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread match state, shared by every pattern: match data with one pair (only the overall
// match is read) and a JIT stack large enough for long whitespace runs.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    MEGATRON_ASSERT(data && context && stack, "PCRE2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

PreTokenizerRegex::PreTokenizerRegex(std::string_view pattern, std::string_view source) {
  const std::string expanded = expand_white_space(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded.data()), expanded.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    MEGATRON_CHECK(false, source, ": pre-tokenizer pattern does not compile at offset ", offset,
                   " (", reinterpret_cast<const char*>(message), "): ", pattern);
  }
  // JIT is an optimisation: without it (unsupported CPU) the interpreter gives the same matches.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizerRegex::~PreTokenizerRegex() {
  pcre2_code_free(code_);
}

bool PreTokenizerRegex::next_match(std::string_view text, size_t start, size_t* begin,
                                   size_t* end) const {
  MatchState& state = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (start < text.size()) {
    // The subject is valid UTF-8 (callers repair it first), so the UTF check is skipped.
    const int rc =
        jit_ ? pcre2_jit_match(code_, subject, text.size(), start, 0, state.data, state.context)
             : pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                           state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      MEGATRON_CHECK(false, "pre-tokenizer regex failed on a ", text.size(), "-byte text (",
                     reinterpret_cast<const char*>(message), "); split the document");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    if (ovector[1] > ovector[0]) {
      *begin = ovector[0];
      *end = ovector[1];
      return true;
    }
    // An empty match yields no piece: step over one character and search again.
    start = ovector[0] + 1;
    while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      ++start;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Byte map

const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {  // every code point here is below U+0800
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[b] = s;
    }
    return t;
  }();
  return table;
}

namespace {

// Inverse of byte_to_unicode() over one token string. Characters outside the map keep their own
// UTF-8 bytes, as HF's ByteLevel decoder does (added tokens are not byte-mapped).
std::string token_to_bytes(std::string_view token) {
  static const std::unordered_map<std::string, unsigned char> inverse = [] {
    std::unordered_map<std::string, unsigned char> m;
    const auto& t = byte_to_unicode();
    for (int b = 0; b < 256; ++b) m.emplace(t[b], static_cast<unsigned char>(b));
    return m;
  }();
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const auto* s = reinterpret_cast<const unsigned char*>(token.data());
    const int len = utf8_step(s, token.size(), i);
    const size_t step = static_cast<size_t>(len > 0 ? len : -len);
    const auto it = inverse.find(std::string(token.substr(i, step)));
    if (it != inverse.end()) {
      out += static_cast<char>(it->second);
    } else {
      out += token.substr(i, step);
    }
    i += step;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ByteLevelBpe

// The piece cache: 64 mutex-guarded shards, each a flat open-addressed table whose entries hold
// the piece and its ids inline, so a hit costs one hash and one cache line. Pieces longer than
// kCachedKeyBytes or with more than kCachedIds ids (rare: long numbers, URLs) are not cached. A
// full probe window evicts the entry at the home slot, which keeps the cache bounded (8 MiB).
namespace {
constexpr size_t kCacheShards = 64;
constexpr size_t kCacheSlotsPerShard = 2048;  // power of two
constexpr size_t kCacheProbe = 8;
constexpr size_t kCachedKeyBytes = 22;
constexpr size_t kCachedIds = 8;

struct CacheEntry {
  uint64_t hash = 0;  // 0: empty slot
  uint8_t key_len = 0;
  uint8_t num_ids = 0;
  char key[kCachedKeyBytes];
  int32_t ids[kCachedIds];
};
static_assert(sizeof(CacheEntry) == 64, "one cache line per entry");

uint64_t piece_hash(std::string_view bytes) {
  const uint64_t h = std::hash<std::string_view>{}(bytes);
  return h == 0 ? 1 : h;
}
}  // namespace

struct ByteLevelBpe::CacheShard {
  std::mutex mutex;
  std::vector<CacheEntry> slots = std::vector<CacheEntry>(kCacheSlotsPerShard);
};

ByteLevelBpe::ByteLevelBpe(std::unordered_map<std::string, int64_t> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           bool ignore_merges, std::string_view source)
    : vocab_(std::move(vocab)),
      ignore_merges_(ignore_merges),
      cache_(std::make_unique<CacheShard[]>(kCacheShards)) {
  MEGATRON_CHECK(!vocab_.empty(), source, ": the vocabulary is empty");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    MEGATRON_CHECK(id >= 0 && id < (int64_t{1} << 31), source, ": token ", token, " has id ", id,
                   "; ids must be in [0, 2^31)");
    max_id = std::max(max_id, id);
  }
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_known_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    id_bytes_[static_cast<size_t>(id)] = token_to_bytes(token);
    id_known_[static_cast<size_t>(id)] = true;
  }
  const auto& table = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(table[b]);
    MEGATRON_CHECK(it != vocab_.end(), source, ": the vocabulary lacks the byte-level symbol \"",
                   table[b], "\" for byte ", b, "; a byte-level BPE vocabulary needs all 256");
    byte_id_[b] = static_cast<int32_t>(it->second);
  }
  MEGATRON_CHECK(!merges.empty(), source,
                 ": the merge list is empty; a BPE tokenizer needs its merges (check the file is "
                 "the right one and complete)");
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = vocab_.find(left);
    const auto r = vocab_.find(right);
    const auto m = vocab_.find(left + right);
    MEGATRON_CHECK(l != vocab_.end() && r != vocab_.end() && m != vocab_.end(), source, ": merge ",
                   rank, " (\"", left, "\" \"", right,
                   "\") uses a token missing from the vocabulary; the vocabulary and merges do "
                   "not belong together");
    const uint64_t key =
        (static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(r->second);
    // A pair listed twice keeps its last rank, as encoder.py's dict and HF's merge map do.
    merges_.insert_or_assign(key,
                             Merge{static_cast<int32_t>(rank), static_cast<int32_t>(m->second)});
  }
}

ByteLevelBpe::~ByteLevelBpe() = default;

const ByteLevelBpe::Merge* ByteLevelBpe::find_merge(int32_t left, int32_t right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const auto it = merges_.find(key);
  return it == merges_.end() ? nullptr : &it->second;
}

void ByteLevelBpe::merge_word(std::vector<int32_t>* word) const {
  // Symbols form a linked list over the initial positions; a merge keeps the left position, so
  // (rank, position) orders candidates lowest rank first, then leftmost.
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(word->size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) symbols[i] = {(*word)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int32_t pos) {
    const Symbol& s = symbols[pos];
    if (s.next < 0) return;
    if (const Merge* m = find_merge(s.id, symbols[s.next].id))
      queue.push({m->rank, pos, m->new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& s = symbols[top.pos];
    if (!s.alive || s.next < 0) continue;
    // Stale entry: the pair at this position changed since it was queued.
    const Merge* m = find_merge(s.id, symbols[s.next].id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    Symbol& right = symbols[s.next];
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) symbols[s.next].prev = top.pos;
    if (s.prev >= 0) push(s.prev);
    push(top.pos);
  }
  word->clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) word->push_back(symbols[i].id);
}

void ByteLevelBpe::encode_piece(std::string_view bytes, std::vector<int64_t>* ids) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    ids->push_back(byte_id_[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  const bool cacheable = bytes.size() <= kCachedKeyBytes;
  const uint64_t hash = cacheable ? piece_hash(bytes) : 0;
  CacheShard& shard = cache_[(hash >> 58) % kCacheShards];
  const size_t home = static_cast<size_t>(hash) % kCacheSlotsPerShard;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    for (size_t k = 0; k < kCacheProbe; ++k) {
      const CacheEntry& e = shard.slots[(home + k) % kCacheSlotsPerShard];
      if (e.hash == 0) break;
      if (e.hash == hash && e.key_len == bytes.size() &&
          std::memcmp(e.key, bytes.data(), bytes.size()) == 0) {
        ids->insert(ids->end(), e.ids, e.ids + e.num_ids);
        return;
      }
    }
  }
  std::vector<int32_t> word;
  bool found = false;
  if (ignore_merges_) {
    std::string mapped;
    const auto& table = byte_to_unicode();
    for (const char c : bytes) mapped += table[static_cast<unsigned char>(c)];
    if (const auto it = vocab_.find(mapped); it != vocab_.end()) {
      word.assign(1, static_cast<int32_t>(it->second));
      found = true;
    }
  }
  if (!found) {
    word.resize(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      word[i] = byte_id_[static_cast<unsigned char>(bytes[i])];
    }
    merge_word(&word);
  }
  ids->insert(ids->end(), word.begin(), word.end());
  if (cacheable && word.size() <= kCachedIds) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    size_t slot = home;
    for (size_t k = 0; k < kCacheProbe; ++k) {
      const size_t candidate = (home + k) % kCacheSlotsPerShard;
      if (shard.slots[candidate].hash == 0 || shard.slots[candidate].hash == hash) {
        slot = candidate;
        break;
      }
    }
    CacheEntry& e = shard.slots[slot];
    e.hash = hash;
    e.key_len = static_cast<uint8_t>(bytes.size());
    e.num_ids = static_cast<uint8_t>(word.size());
    std::memcpy(e.key, bytes.data(), bytes.size());
    std::copy(word.begin(), word.end(), e.ids);
  }
}

bool ByteLevelBpe::append_token_bytes(int64_t id, std::string* out) const {
  if (id < 0 || id >= static_cast<int64_t>(id_bytes_.size()) || !id_known_[id]) return false;
  out->append(id_bytes_[static_cast<size_t>(id)]);
  return true;
}

int64_t ByteLevelBpe::token_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

// ---------------------------------------------------------------------------------------------
// GPT2BPETokenizer

namespace {

std::unordered_map<std::string, int64_t> parse_encoder_json(const std::string& text,
                                                            const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    MEGATRON_CHECK(false, "--vocab-file ", path, ": not valid JSON (", e.what(),
                   "); pass GPT-2's encoder.json");
  }
  MEGATRON_CHECK(json.is_object(), "--vocab-file ", path,
                 ": expected a JSON object token -> id (GPT-2's encoder.json), got ",
                 json.type_name());
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(json.size());
  for (const auto& [token, id] : json.items()) {
    MEGATRON_CHECK(id.is_number_integer(), "--vocab-file ", path, ": the id of token ", token,
                   " is not an integer");
    vocab.emplace(token, id.get<int64_t>());
  }
  return vocab;
}

// vocab.bpe: a "#version" header, then one "left right" merge per line, rank = line order.
std::vector<std::pair<std::string, std::string>> parse_merges_txt(const std::string& text,
                                                                  const std::string& path) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_start = 0;
  int64_t line_no = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_no;
    if (line_no == 1 && line.starts_with("#")) continue;
    std::vector<std::string_view> fields;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      const size_t begin = i;
      while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i > begin) fields.push_back(line.substr(begin, i - begin));
    }
    if (fields.empty()) continue;
    MEGATRON_CHECK(fields.size() == 2, "--merge-file ", path, " line ", line_no,
                   ": expected two space-separated tokens (GPT-2's vocab.bpe), got \"", line, "\"");
    merges.emplace_back(std::string(fields[0]), std::string(fields[1]));
  }
  return merges;
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : regex_(kGpt2Pattern, "GPT2BPETokenizer") {
  const std::string vocab_text = read_tokenizer_file(vocab_file, "--vocab-file");
  const std::string merges_text = read_tokenizer_file(merge_file, "--merge-file");
  auto vocab = parse_encoder_json(vocab_text, vocab_file);
  const auto merges = parse_merges_txt(merges_text, merge_file);
  MEGATRON_CHECK(!merges.empty(), "--merge-file ", merge_file,
                 ": no merges found; pass GPT-2's vocab.bpe");
  const auto eod = vocab.find("<|endoftext|>");
  MEGATRON_CHECK(eod != vocab.end(), "--vocab-file ", vocab_file,
                 ": no \"<|endoftext|>\" token, which GPT2BPETokenizer uses as EOD");
  eod_ = eod->second;
  vocab_size_ = static_cast<int64_t>(vocab.size());
  bpe_ = std::make_unique<ByteLevelBpe>(std::move(vocab), merges, /*ignore_merges=*/false,
                                        "--vocab-file " + vocab_file);
  MEGATRON_CHECK(bpe_->max_id() + 1 == vocab_size_, "--vocab-file ", vocab_file,
                 ": ids must be 0..N-1 for N tokens, but the largest id is ", bpe_->max_id(),
                 " for ", vocab_size_, " tokens");
  identity_ =
      "GPT2BPETokenizer/sha256:" + sha256_hex(sha256_hex(vocab_text) + sha256_hex(merges_text));
}

std::vector<int64_t> GPT2BPETokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  regex_.for_each_match(text, [&](size_t begin, size_t end) {
    bpe_->encode_piece(text.substr(begin, end - begin), &ids);
  });
  return ids;
}

std::string GPT2BPETokenizer::decode(std::span<const int64_t> ids) const {
  std::string bytes;
  for (const int64_t id : ids) {
    MEGATRON_CHECK(bpe_->append_token_bytes(id, &bytes), "GPT2BPETokenizer: token id ", id,
                   " is outside the vocabulary [0, ", vocab_size_, ")");
  }
  // Token boundaries need not fall on character boundaries: repair as encoder.py's
  // decode(errors="replace") does.
  return is_valid_utf8(bytes) ? bytes : replace_invalid_utf8(bytes);
}

}  // namespace megatron
