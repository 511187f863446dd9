// Classification examples from TSV / JSON lines, Megatron's sample layout: see the header.
#include "data/classification_dataset.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/numpy_random.h"

namespace megatron {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t tab = line.find('\t', pos);
    out.push_back(line.substr(pos, tab == std::string::npos ? std::string::npos : tab - pos));
    if (tab == std::string::npos) return out;
    pos = tab + 1;
  }
}

std::string strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool is_jsonl(const std::string& path) {
  auto ends = [&](const std::string& x) {
    return path.size() >= x.size() && path.compare(path.size() - x.size(), x.size(), x) == 0;
  };
  return ends(".jsonl") || ends(".json");
}

// A JSON value as label text: strings as they are, numbers and booleans as JSON prints them.
std::string label_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

ClassificationTask classification_task(const std::string& name) {
  if (name == "MNLI")
    return {"MNLI",      "sentence1",  "",
            "sentence2", "gold_label", {"contradiction", "entailment", "neutral"}};
  if (name == "QQP") return {"QQP", "question1", "", "question2", "is_duplicate", {"0", "1"}};
  if (name == "classification") return {"classification", "text_a", "text", "text_b", "label", {}};
  MEGATRON_CHECK(false, "--task ", name,
                 " is not supported; choose classification (text_a, "
                 "text_b, label), MNLI or QQP");
  return {};
}

std::string clean_text(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    // Python's \s in a str pattern: ASCII whitespace here (non-ASCII spaces are rare in these
    // files and WordPiece treats them as spaces anyway).
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (ws) {
      space = true;
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  if (space) out += ' ';
  for (int k = 0; k < 3; ++k) {
    std::string next;
    size_t pos = 0;
    for (size_t at; (at = out.find(" . ", pos)) != std::string::npos; pos = at + 3) {
      next.append(out, pos, at - pos);
      next += ". ";
    }
    next.append(out, pos, std::string::npos);
    out = std::move(next);
  }
  return out;
}

std::vector<ClassificationExample> read_classification_examples(
    const ClassificationTask& task, const std::vector<std::string>& files, const char* flag) {
  std::vector<ClassificationExample> out;
  for (const std::string& file : files) {
    std::ifstream in(file);
    MEGATRON_CHECK(in.good(), flag, " ", file, ": cannot open");
    std::string line;
    int64_t line_no = 0;
    if (is_jsonl(file)) {
      while (std::getline(in, line)) {
        ++line_no;
        if (strip(line).empty()) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          MEGATRON_CHECK(false, file, ":", line_no, ": not valid JSON (", e.what(), ")");
        }
        auto text = [&](const std::string& key, const std::string& alt, bool required,
                        bool* present) -> std::string {
          const nlohmann::json* v = nullptr;
          if (j.is_object() && j.contains(key)) v = &j[key];
          if (!v && !alt.empty() && j.is_object() && j.contains(alt)) v = &j[alt];
          *present = v != nullptr && !v->is_null();
          MEGATRON_CHECK(*present || !required, file, ":", line_no, ": no \"", key, "\"",
                         alt.empty() ? "" : " (or \"" + alt + "\")", " in the JSON object; --task ",
                         task.name, " reads ", task.a, ", ", task.b, " and ", task.label);
          if (!*present) return "";
          MEGATRON_CHECK(v->is_string() || key == task.label, file, ":", line_no, ": \"", key,
                         "\" must be a string");
          return v->is_string() ? v->get<std::string>() : label_text(*v);
        };
        ClassificationExample e;
        bool present = false;
        e.text_a = clean_text(strip(text(task.a, task.a_alt, true, &present)));
        e.text_b = clean_text(strip(text(task.b, "", false, &e.has_b)));
        e.label = strip(text(task.label, "", true, &present));
        out.push_back(std::move(e));
      }
      continue;
    }
    // TSV: the header names the columns (GLUE's files: MNLI's sentence1/sentence2/gold_label,
    // QQP's question1/question2/is_duplicate).
    MEGATRON_CHECK(static_cast<bool>(std::getline(in, line)), flag, " ", file,
                   ": empty; a TSV file starts with a header row naming its columns");
    ++line_no;
    const std::vector<std::string> header = split_tabs(strip(line));
    auto column = [&](const std::string& name) -> int64_t {
      auto it = std::find(header.begin(), header.end(), name);
      return it == header.end() ? -1 : it - header.begin();
    };
    int64_t ca = column(task.a);
    if (ca < 0 && !task.a_alt.empty()) ca = column(task.a_alt);
    const int64_t cb = column(task.b), cl = column(task.label);
    MEGATRON_CHECK(ca >= 0 && cl >= 0, flag, " ", file, ": the header row has no '", task.a, "'",
                   task.a_alt.empty() ? "" : " (or '" + task.a_alt + "')", " or '", task.label,
                   "' column; --task ", task.name, " reads ", task.a, ", ", task.b,
                   " (optional) and ", task.label);
    while (std::getline(in, line)) {
      ++line_no;
      if (strip(line).empty()) continue;
      const std::vector<std::string> row = split_tabs(line);
      const int64_t need = std::max({ca, cb, cl});
      MEGATRON_CHECK(static_cast<int64_t>(row.size()) > need, file, ":", line_no, ": ", row.size(),
                     " columns, the header has ", header.size());
      ClassificationExample e;
      e.text_a = clean_text(strip(row[static_cast<size_t>(ca)]));
      e.has_b = cb >= 0;
      if (e.has_b) e.text_b = clean_text(strip(row[static_cast<size_t>(cb)]));
      e.label = strip(row[static_cast<size_t>(cl)]);
      out.push_back(std::move(e));
    }
  }
  MEGATRON_CHECK(!out.empty(), flag, ": no examples in ", files.empty() ? "(no files)" : files[0],
                 files.size() > 1 ? " and the others" : "");
  return out;
}

std::vector<std::string> classification_labels(const ClassificationTask& task,
                                               const std::vector<ClassificationExample>& train) {
  if (!task.labels.empty()) return task.labels;
  std::set<std::string> seen;
  for (const ClassificationExample& e : train) seen.insert(e.label);
  MEGATRON_CHECK(seen.size() >= 2, "--train-data: ", seen.size(),
                 " distinct label(s); classification needs at least two classes");
  return {seen.begin(), seen.end()};
}

void build_tokens_types_paddings(std::span<const int64_t> a, const std::vector<int64_t>* b,
                                 int64_t seq_length, const SpecialTokens& sp, int64_t* text,
                                 int64_t* types, int64_t* padding) {
  std::vector<int64_t> ids{sp.cls}, ty{0}, pad{1};
  ids.insert(ids.end(), a.begin(), a.end());
  ty.insert(ty.end(), a.size(), 0);
  pad.insert(pad.end(), a.size(), 1);
  ids.push_back(sp.sep);
  ty.push_back(0);
  pad.push_back(1);
  if (b) {
    ids.insert(ids.end(), b->begin(), b->end());
    ty.insert(ty.end(), b->size(), 1);
    pad.insert(pad.end(), b->size(), 1);
  }
  bool trimmed = false;
  if (static_cast<int64_t>(ids.size()) >= seq_length) {
    ids.resize(static_cast<size_t>(seq_length - 1));
    ty.resize(ids.size());
    pad.resize(ids.size());
    trimmed = true;
  }
  if (b || trimmed) {
    ids.push_back(sp.sep);
    ty.push_back(b ? 1 : 0);
    pad.push_back(1);
  }
  for (int64_t i = 0; i < seq_length; ++i) {
    const bool real = i < static_cast<int64_t>(ids.size());
    text[i] = real ? ids[static_cast<size_t>(i)] : sp.pad;
    types[i] = real ? ty[static_cast<size_t>(i)] : sp.pad;
    padding[i] = real ? pad[static_cast<size_t>(i)] : 0;
  }
}

ClassificationDataset::ClassificationDataset(const std::vector<ClassificationExample>& examples,
                                             const std::vector<std::string>& labels,
                                             const Tokenizer& tokenizer, int64_t seq_length,
                                             bool train, int64_t size, int64_t batch, uint32_t seed,
                                             const char* flag)
    : seq_length_(seq_length), size_(size), train_(train), seed_(seed) {
  const SpecialTokens sp = tokenizer.special_tokens();
  MEGATRON_CHECK(sp.cls >= 0 && sp.sep >= 0 && sp.pad >= 0,
                 "classification finetuning needs a tokenizer with [CLS], [SEP] and [PAD]: pass "
                 "--tokenizer-type BertWordPieceLowerCase (or BertWordPieceCase) and the "
                 "pretrained model's --vocab-file");
  MEGATRON_CHECK(seq_length >= 3, "--seq-length ", seq_length, " is too short for [CLS] x [SEP]");
  for (const ClassificationExample& e : examples) {
    auto it = std::find(labels.begin(), labels.end(), e.label);
    MEGATRON_CHECK(it != labels.end(), flag, ": label '", e.label,
                   "' is not one of the training data's classes");
    std::vector<int64_t> r(static_cast<size_t>(ClassificationRecord::width(seq_length)));
    const std::vector<int64_t> a = tokenizer.encode(e.text_a);
    std::vector<int64_t> b;
    if (e.has_b) b = tokenizer.encode(e.text_b);
    build_tokens_types_paddings(a, e.has_b ? &b : nullptr, seq_length, sp, r.data(),
                                r.data() + seq_length, r.data() + 2 * seq_length);
    r.back() = it - labels.begin();
    records_.push_back(std::move(r));
  }
  if (!train) {
    MEGATRON_CHECK(batch > 0, "validation batches must hold at least one sample");
    const int64_t n = num_examples();
    padded_ = (n + batch - 1) / batch * batch;
    size_ = std::max(size_, padded_);  // cyclic: as many samples as the evaluations read
  }
}

void ClassificationDataset::sample(int64_t index, int64_t* out) const {
  MEGATRON_CHECK(index >= 0 && (!train_ || index < size_), "sample ", index,
                 " is outside the classification dataset");
  const int64_t n = num_examples(), w = sample_width();
  if (!train_) {
    const int64_t j = index % padded_;
    if (j < n) {
      std::copy_n(records_[static_cast<size_t>(j)].begin(), w, out);
    } else {  // a padding sample: one [CLS] [SEP] sequence, label -1
      std::copy_n(records_[0].begin(), w, out);
      out[w - 1] = -1;
    }
    return;
  }
  const int64_t epoch = index / n, j = index % n;
  // numpy.random.RandomState(seed + epoch).permutation(n), element j (the permutation is a
  // shuffle of arange(n); drawn here per call: a sample's order never depends on thread timing).
  NumpyRandomState rng(static_cast<uint32_t>(seed_ + static_cast<uint64_t>(epoch)));
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  rng.shuffle(std::span<int64_t>(perm));
  std::copy_n(records_[static_cast<size_t>(perm[static_cast<size_t>(j)])].begin(), w, out);
}

}  // namespace megatron
