// Supervised finetuning conversations, their tokenization and samples: see the header.
#include "data/sft_dataset.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "data/gpt_dataset.h"

namespace megatron {

namespace {

// Python's str.strip(): leading and trailing characters for which str.isspace() holds (ASCII
// white space, the separators U+001C..U+001F, and Unicode's space characters), on UTF-8.
std::string python_strip(const std::string& s) {
  auto space_at = [&](size_t i, size_t* len) {
    const auto c = static_cast<unsigned char>(s[i]);
    *len = 1;
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
    auto starts = [&](const char* seq) {
      const size_t n = std::char_traits<char>::length(seq);
      if (s.compare(i, n, seq) != 0) return false;
      *len = n;
      return true;
    };
    // U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000
    if (starts("\xc2\x85") || starts("\xc2\xa0") || starts("\xe1\x9a\x80") ||
        starts("\xe2\x80\xa8") || starts("\xe2\x80\xa9") || starts("\xe2\x80\xaf") ||
        starts("\xe2\x81\x9f") || starts("\xe3\x80\x80"))
      return true;
    if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
        static_cast<unsigned char>(s[i + 2]) <= 0x8a) {
      *len = 3;
      return true;
    }
    return false;
  };
  size_t begin = 0, len = 0;
  while (begin < s.size() && space_at(begin, &len)) begin += len;
  // From the end: step back over whole UTF-8 characters.
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    if (!space_at(start, &len) || start + len != end) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace

std::vector<SftConversation> read_sft_conversations(const std::string& path) {
  std::ifstream in(path);
  MEGATRON_CHECK(in.good(), "--sft data ", path,
                 ": cannot open it (a JSON-lines file of "
                 "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]} per line)");
  std::vector<SftConversation> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    MEGATRON_CHECK(
        !j.is_discarded() && j.is_object() && j.contains("messages") && j["messages"].is_array(),
        "--sft data ", path, " line ", number, ": not a JSON object with a \"messages\" list");
    SftConversation c;
    c.line = number;
    for (const nlohmann::json& m : j["messages"]) {
      MEGATRON_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                         m.contains("content") && m["content"].is_string(),
                     "--sft data ", path, " line ", number,
                     ": every message needs string \"role\" and \"content\"");
      c.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    out.push_back(std::move(c));
  }
  MEGATRON_CHECK(!out.empty(), "--sft data ", path, ": no conversations");
  return out;
}

SftTokenizer::SftTokenizer(const HuggingFaceTokenizer& tokenizer, const std::string& format)
    : tokenizer_(tokenizer) {
  MEGATRON_CHECK(format == "nemotron-h-aligned", "--sft-tokenizer-prompt-format: unknown '", format,
                 "' (Megatron's SFT tokenizer has nemotron-h-aligned)");
  pad_ = tokenizer_.token_to_id("<SPECIAL_233>");
  MEGATRON_CHECK(pad_ >= 0,
                 "--sft-tokenizer-prompt-format nemotron-h-aligned pads with "
                 "<SPECIAL_233>, which the tokenizer (",
                 tokenizer_.identity(), ") does not have: use a Nemotron-H tokenizer");
}

std::string SftTokenizer::render(const std::vector<SftMessage>& messages) const {
  std::string out;
  for (const SftMessage& m : messages) {
    if (m.role == "system") {
      out += "<SPECIAL_10>System\n" + python_strip(m.content) + "\n";
    } else if (m.role == "user") {
      out += "<SPECIAL_11>User\n" + python_strip(m.content) + "\n<SPECIAL_11>Assistant\n";
    } else if (m.role == "assistant") {
      out += python_strip(m.content) + "\n";
    }
  }
  return out;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> SftTokenizer::tokenize(
    const SftConversation& conversation) const {
  const std::vector<SftMessage>& c = conversation.messages;
  std::vector<int64_t> tokens = tokenizer_.encode_plain(render(c));
  std::vector<int64_t> target = tokens;
  size_t at = 0;
  for (size_t t = 0; t < c.size(); ++t) {
    std::string role = c[t].role;
    std::transform(role.begin(), role.end(), role.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    MEGATRON_CHECK(role != "assistant" || !c[t].content.empty(), "empty assistant turn (turn ", t,
                   ")");
    if (role == "assistant") {
      // Megatron reads conversation[turn_idx - 1]: for the first turn, Python's index -1 is
      // the last turn.
      std::string previous = t > 0 ? c[t - 1].role : c.back().role;
      std::transform(previous.begin(), previous.end(), previous.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      MEGATRON_CHECK(previous == "user", "assistant turn ", t, " does not follow a user turn");
    }
    MEGATRON_CHECK(role == "system" || role == "user" || role == "assistant", "turn ", t,
                   ": unknown role '", c[t].role, "' (system, user or assistant)");
    const std::vector<int64_t> alone = tokenizer_.encode_plain(render({c[t]}));
    MEGATRON_CHECK(at + alone.size() <= tokens.size() &&
                       std::equal(alone.begin(), alone.end(), tokens.begin() + at),
                   "turn ", t,
                   " tokenizes differently alone than in the conversation (the "
                   "tokenizer merges across the turn boundary)");
    if (role == "system" || role == "user")
      std::fill(target.begin() + at, target.begin() + at + alone.size(), kSftIgnoreIndex);
    at += alone.size();
  }
  MEGATRON_CHECK(at == tokens.size(), "the turns cover ", at, " of the conversation's ",
                 tokens.size(), " tokens");
  return {std::move(tokens), std::move(target)};
}

SftDataset::SftDataset(std::shared_ptr<const std::vector<SftConversation>> conversations,
                       int64_t begin, int64_t end, int64_t num_samples, int64_t seq_length,
                       std::shared_ptr<const SftTokenizer> tokenizer, std::string path)
    : conversations_(std::move(conversations)),
      begin_(begin),
      end_(end),
      num_samples_(num_samples),
      seq_length_(seq_length),
      tokenizer_(std::move(tokenizer)),
      path_(std::move(path)) {
  MEGATRON_ASSERT(begin >= 0 && begin < end &&
                      end <= static_cast<int64_t>(conversations_->size()) && seq_length > 1,
                  "bad SFT dataset range");
}

void SftDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && index < num_samples_, "SFT sample ", index, " is outside [0, ",
                 num_samples_, ")");
  const SftConversation& conversation =
      (*conversations_)[static_cast<size_t>(begin_ + index % (end_ - begin_))];
  std::vector<int64_t> tokens, target;
  try {
    std::tie(tokens, target) = tokenizer_->tokenize(conversation);
  } catch (const InvalidArgument& e) {
    MEGATRON_CHECK(false, "--sft data ", path_, " line ", conversation.line, ": ", e.what());
  }
  const size_t keep = static_cast<size_t>(seq_length_ - 1);  // room for the EOD
  if (tokens.size() > keep) {
    tokens.resize(keep);
    target.resize(keep);
  }
  tokens.push_back(tokenizer_->eod());
  target.push_back(tokenizer_->eod());
  tokens.resize(static_cast<size_t>(seq_length_ + 1), tokenizer_->pad());
  target.resize(static_cast<size_t>(seq_length_ + 1), tokenizer_->pad());
  std::copy(tokens.begin(), tokens.end() - 1, out);                // inputs: tokens[:-1]
  std::copy(target.begin() + 1, target.end(), out + seq_length_);  // targets: target[1:]
}

Datasets build_sft_datasets(const DataConfig& config, const HuggingFaceTokenizer& tokenizer,
                            int64_t seq_length, const SampleCounts& counts, bool log) {
  auto sft = std::make_shared<const SftTokenizer>(tokenizer, config.sft_prompt_format);
  const std::array<int64_t, 3> wanted = {counts.train, counts.valid, counts.test};
  const std::array<const char*, 3> names = {"train", "validation", "test"};
  std::array<std::unique_ptr<SampleSource>, 3> out;
  auto one_file = [](const std::vector<std::string>& words, const char* flag) {
    MEGATRON_CHECK(words.size() == 1, flag,
                   " with --sft takes one JSON-lines file (blends of "
                   "several SFT files are not implemented), got ",
                   words.size(), " words");
    return words[0];
  };
  auto build = [&](size_t i, const std::string& path,
                   std::shared_ptr<const std::vector<SftConversation>> conversations, int64_t begin,
                   int64_t end) {
    if (wanted[i] <= 0 || end <= begin) return;
    out[i] = std::make_unique<SftDataset>(std::move(conversations), begin, end, wanted[i],
                                          seq_length, sft, path);
    if (log) {
      log_line(strprintf(" > SFT %s split: conversations [%ld, %ld) of %s, %ld samples", names[i],
                         static_cast<long>(begin), static_cast<long>(end), path.c_str(),
                         static_cast<long>(wanted[i])));
    }
  };
  if (!config.data_path.empty()) {
    const std::string path = one_file(config.data_path, "--data-path");
    auto conversations =
        std::make_shared<const std::vector<SftConversation>>(read_sft_conversations(path));
    const auto ranges =
        split_document_ranges(config.split, static_cast<int64_t>(conversations->size()));
    for (size_t i = 0; i < 3; ++i)
      if (ranges[i]) build(i, path, conversations, ranges[i]->begin, ranges[i]->end);
  } else {
    const std::array<const std::vector<std::string>*, 3> paths = {
        &config.train_data_path, &config.valid_data_path, &config.test_data_path};
    const std::array<const char*, 3> flags = {"--train-data-path", "--valid-data-path",
                                              "--test-data-path"};
    for (size_t i = 0; i < 3; ++i) {
      if (paths[i]->empty()) continue;
      const std::string path = one_file(*paths[i], flags[i]);
      auto conversations =
          std::make_shared<const std::vector<SftConversation>>(read_sft_conversations(path));
      build(i, path, conversations, 0, static_cast<int64_t>(conversations->size()));
    }
  }
  MEGATRON_CHECK(out[0] != nullptr,
                 "--sft: no training conversations (check --split or "
                 "--train-data-path)");
  Datasets d;
  d.train = std::move(out[0]);
  d.valid = std::move(out[1]);
  d.test = std::move(out[2]);
  return d;
}

GPTBatch make_sft_batch(const SampleSource& data, int64_t first, int64_t b, int64_t pad) {
  const int64_t s = data.seq_length();
  GPTBatch batch;
  batch.tokens = Tensor::empty({b, s}, DType::kI64);
  batch.labels = Tensor::empty({b, s}, DType::kI64);
  batch.loss_mask = Tensor::empty({b, s}, DType::kF32);
  batch.positions = Tensor::empty({b, s}, DType::kI64);
  std::vector<int64_t> record(static_cast<size_t>(2 * s));
  for (int64_t i = 0; i < b; ++i) {
    data.sample(first + i, record.data());
    int64_t* tokens = batch.tokens.data<int64_t>() + i * s;
    int64_t* labels = batch.labels.data<int64_t>() + i * s;
    float* mask = batch.loss_mask.data<float>() + i * s;
    int64_t* positions = batch.positions.data<int64_t>() + i * s;
    for (int64_t t = 0; t < s; ++t) {
      const int64_t target = record[static_cast<size_t>(s + t)];
      tokens[t] = record[static_cast<size_t>(t)];
      const bool masked = target == pad || target == kSftIgnoreIndex;
      mask[t] = masked ? 0.0f : 1.0f;
      labels[t] = target == kSftIgnoreIndex ? pad : target;  // any valid id: its loss is masked
      positions[t] = t;
    }
  }
  return batch;
}

}  // namespace megatron
