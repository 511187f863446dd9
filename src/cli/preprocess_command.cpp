// `megatron preprocess`: Megatron's tools/preprocess_data.py. Tokenizes a JSON-lines file into one
// indexed dataset per --json-keys key, `<output-prefix>_<key>_document.bin/.idx`, byte for byte
// what preprocess_data.py writes for the same tokenizer. With --split-sentences each document is
// first cut into sentences (data/sentence_splitter.h: ICU's rules where Megatron uses NLTK's
// punkt, so boundaries can differ) and the outputs are `<output-prefix>_<key>_sentence.bin/.idx`,
// one sequence per sentence: what BERT and T5 data read.
//
// Per line and key, as preprocess_data.py does: a string value is one sequence, a list of strings
// one sequence per element; sequences that tokenize to nothing are dropped; with --append-eod the
// EOD id is appended to the last sequence of every document that kept at least one token. A
// document with no tokens is still a document: it adds no sequence but one document_indices
// entry, so document counts always equal line counts.
//
// Pipeline: a reader thread cuts the file into chunks of whole lines, --workers threads parse and
// tokenize chunks in any order, and the calling thread writes results strictly in chunk order.
// The output therefore does not depend on the worker count, and an error is always reported for
// the first bad line of the file. Nothing is written under the output names unless every line
// succeeds (the builder renames its files into place at the end).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/preprocess_partitions.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/threads.h"
#include "core/timer.h"
#include "data/indexed_dataset.h"
#include "data/sentence_splitter.h"
#include "data/tokenizer.h"

namespace megatron::cli {

namespace {

struct PreprocessArgs {
  std::string input;                           // --input: JSON-lines file (required)
  std::vector<std::string> json_keys{"text"};  // --json-keys: one dataset per key
  std::string output_prefix;                   // --output-prefix (required)
  bool append_eod = false;                     // --append-eod
  bool split_sentences = false;                // --split-sentences: one sequence per sentence
  bool keep_newlines = false;                  // --keep-newlines: sentences keep them
  int64_t workers = 0;                         // --workers: tokenizing threads; 0 = all cores
  int64_t log_interval = 1000;                 // --log-interval: documents between progress lines
  int64_t partitions = 1;                      // --partitions: preprocess_data.py's file partitions
  bool keep_sequential_samples = false;        // --keep-sequential-samples: partitions in order
  std::string lang = "english";                // --lang: NLTK's punkt language (see the flag)
  TokenizerArgs tokenizer;                     // --tokenizer-type and its files
};

// Input is cut into chunks of about this many bytes (whole lines): big enough that the
// per-chunk hand-offs cost nothing, small enough that a few per worker keep everyone busy.
constexpr size_t kChunkBytes = 1 << 20;
// Chunks read but not yet written, per worker: bounds memory whatever the file size.
constexpr int64_t kChunksInFlightPerWorker = 4;

// A slice of the input: whole lines in file order (the last line may lack its newline).
struct Chunk {
  int64_t index = 0;
  std::string text;
};

// What the chunk's lines became for one output key.
struct KeyOutput {
  std::vector<int64_t> tokens;     // every kept sequence of the chunk, back to back
  std::vector<int32_t> lengths;    // tokens per kept sequence
  std::vector<int32_t> sequences;  // kept sequences per line (one document per line)
};

// A worker's result for one chunk.
struct Encoded {
  std::vector<KeyOutput> keys;
  std::vector<int64_t> line_bytes;  // bytes of each line, newline included (for MB/s)
  // First line (0-based within the chunk) that failed, and why; lines before it are complete.
  int64_t error_line = -1;
  std::string error;
  std::exception_ptr failure;  // set instead of `error` for anything but a caller error
};

// Splits a JSON parse error's text down to the part a user needs.
std::string json_error_text(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s = s.substr(close + 2);
  }
  // The parser sees one line at a time, so its "line 1" would only confuse.
  const size_t at = s.find("at line 1, column");
  if (at != std::string::npos) s.replace(at, 17, "at column");
  return s;
}

std::string keys_of(const nlohmann::json& obj) {
  std::string s;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!s.empty()) s += ", ";
    s += "'" + it.key() + "'";
    if (s.size() > 200) return s + ", ...";
  }
  return s.empty() ? "none" : s;
}

class Encoder {
 public:
  Encoder(const PreprocessArgs& args, const Tokenizer& tokenizer, const SentenceSplitter* splitter)
      : args_(args), tokenizer_(tokenizer), splitter_(splitter), eod_(tokenizer.eod()) {}

  Encoded encode(const std::string& text) const {
    Encoded out;
    out.keys.resize(args_.json_keys.size());
    size_t pos = 0;
    int64_t line = 0;
    while (pos < text.size()) {
      const char* nl =
          static_cast<const char*>(std::memchr(text.data() + pos, '\n', text.size() - pos));
      const size_t end = nl ? static_cast<size_t>(nl - text.data()) : text.size();
      const std::string_view view(text.data() + pos, end - pos);
      try {
        encode_line(view, out);
      } catch (const InvalidArgument& e) {
        out.error_line = line;
        out.error = e.what();
        return out;
      } catch (...) {
        out.error_line = line;
        out.failure = std::current_exception();
        return out;
      }
      out.line_bytes.push_back(static_cast<int64_t>(end - pos) + (nl ? 1 : 0));
      pos = end + 1;
      ++line;
    }
    return out;
  }

 private:
  // Adds the line's document to every key's output, or throws InvalidArgument with a message
  // that the writer prefixes with file and line. Nothing is added for any key if it throws.
  void encode_line(std::string_view line, Encoded& out) const {
    MEGATRON_CHECK(line.find_first_not_of(" \t\r") != std::string_view::npos,
                   "the line is empty; each line must hold one JSON object");
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line.begin(), line.end());
    } catch (const nlohmann::json::exception& e) {
      MEGATRON_CHECK(false, "not valid JSON (", json_error_text(e),
                     "); each line must hold one JSON object");
    }
    MEGATRON_CHECK(doc.is_object(), "expected a JSON object, got a JSON ", doc.type_name());
    // Look every key up before touching any output so a failure leaves all keys aligned.
    std::vector<const nlohmann::json*> values;
    for (const std::string& key : args_.json_keys) {
      auto it = doc.find(key);
      MEGATRON_CHECK(it != doc.end(), "no key '", key, "' in the JSON object (it has ",
                     keys_of(doc), "); pass the key that holds the text with --json-keys");
      MEGATRON_CHECK(it->is_string() || it->is_array(), "key '", key, "' is a JSON ",
                     it->type_name(), ", expected a string or a list of strings");
      if (it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i)
          MEGATRON_CHECK((*it)[i].is_string(), "key '", key, "': element ", i, " is a JSON ",
                         (*it)[i].type_name(), ", expected a string");
      }
      values.push_back(&*it);
    }
    std::vector<std::vector<int64_t>> ids(values.size());
    std::vector<std::vector<int32_t>> lengths(values.size());
    for (size_t k = 0; k < values.size(); ++k) {
      auto add = [&](const std::string& sentence) {
        std::vector<int64_t> sentence_ids;
        try {
          sentence_ids = tokenizer_.encode(sentence);
        } catch (const InvalidArgument& e) {
          MEGATRON_CHECK(false, "key '", args_.json_keys[k], "': ", e.what());
        }
        if (sentence_ids.empty()) return;  // preprocess_data.py drops empty sequences
        ids[k].insert(ids[k].end(), sentence_ids.begin(), sentence_ids.end());
        lengths[k].push_back(static_cast<int32_t>(sentence_ids.size()));
      };
      // Each string is one sequence, or with --split-sentences one per sentence.
      auto add_text = [&](const std::string& text) {
        if (!splitter_) return add(text);
        for (const std::string& sentence : splitter_->split(text)) add(sentence);
      };
      const nlohmann::json& v = *values[k];
      if (v.is_string()) {
        add_text(v.get_ref<const std::string&>());
      } else {
        for (const nlohmann::json& s : v) add_text(s.get_ref<const std::string&>());
      }
      if (args_.append_eod && !ids[k].empty()) {
        ids[k].push_back(eod_);
        ++lengths[k].back();
      }
    }
    for (size_t k = 0; k < values.size(); ++k) {
      KeyOutput& o = out.keys[k];
      o.tokens.insert(o.tokens.end(), ids[k].begin(), ids[k].end());
      o.lengths.insert(o.lengths.end(), lengths[k].begin(), lengths[k].end());
      o.sequences.push_back(static_cast<int32_t>(lengths[k].size()));
    }
  }

  const PreprocessArgs& args_;
  const Tokenizer& tokenizer_;
  const SentenceSplitter* splitter_;  // null: no --split-sentences
  const int64_t eod_;
};

// Reader -> workers -> in-order writer. The writer is the calling thread.
class Pipeline {
 public:
  // input: the file fd reads (named in errors).
  Pipeline(const PreprocessArgs& args, const Encoder& encoder, int fd, std::string input)
      : args_(args), encoder_(encoder), fd_(fd), input_(std::move(input)) {
    max_in_flight_ = kChunksInFlightPerWorker * args.workers;
  }

  // Stops and joins every thread; safe whether run() returned or threw.
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    space_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void start() {
    threads_.emplace_back([this] { read_input(); });
    for (int64_t i = 0; i < args_.workers; ++i) threads_.emplace_back([this] { work(); });
  }

  // The next chunk's result in file order, or false at the end of the input.
  bool next(Encoded& out) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] {
      return done_.count(next_) || reader_failure_ || (input_done_ && next_ == chunks_read_);
    });
    if (reader_failure_) std::rethrow_exception(reader_failure_);
    auto it = done_.find(next_);
    if (it == done_.end()) return false;
    out = std::move(it->second);
    done_.erase(it);
    ++next_;
    --in_flight_;
    lock.unlock();
    space_cv_.notify_one();
    return true;
  }

 private:
  void read_input() {
    try {
      std::string carry;
      std::vector<char> block(kChunkBytes);
      int64_t index = 0;
      for (;;) {
        const ssize_t n = ::read(fd_, block.data(), block.size());
        if (n < 0 && errno == EINTR) continue;
        MEGATRON_CHECK(n >= 0, input_, ": read failed (", std::strerror(errno), ")");
        if (n == 0) break;
        carry.append(block.data(), static_cast<size_t>(n));
        if (carry.size() < kChunkBytes) continue;
        // Cut after the last complete line; a line longer than a chunk just grows the carry.
        const size_t nl = carry.find_last_of('\n');
        if (nl == std::string::npos) continue;
        Chunk c{index++, carry.substr(0, nl + 1)};
        carry.erase(0, nl + 1);
        if (!push(std::move(c))) return;
      }
      if (!carry.empty() && !push(Chunk{index++, std::move(carry)})) return;
      std::lock_guard<std::mutex> lock(mu_);
      input_done_ = true;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      reader_failure_ = std::current_exception();
      input_done_ = true;
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
  }

  bool push(Chunk c) {
    std::unique_lock<std::mutex> lock(mu_);
    space_cv_.wait(lock, [&] { return in_flight_ < max_in_flight_ || stop_; });
    if (stop_) return false;
    todo_.push_back(std::move(c));
    ++in_flight_;
    ++chunks_read_;
    lock.unlock();
    work_cv_.notify_one();
    return true;
  }

  void work() {
    for (;;) {
      Chunk c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return !todo_.empty() || input_done_ || stop_; });
        if (stop_ || todo_.empty()) return;
        c = std::move(todo_.front());
        todo_.pop_front();
      }
      Encoded e = encoder_.encode(c.text);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(c.index, std::move(e));
      }
      done_cv_.notify_one();
    }
  }

  const PreprocessArgs& args_;
  const Encoder& encoder_;
  const int fd_;
  const std::string input_;
  int64_t max_in_flight_ = 0;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a chunk is ready or the input ended
  std::condition_variable space_cv_;  // reader: a chunk was written, room for another
  std::condition_variable done_cv_;   // writer: a chunk was encoded or the input ended
  std::deque<Chunk> todo_;
  std::map<int64_t, Encoded> done_;
  int64_t in_flight_ = 0;    // read, not yet handed to the writer
  int64_t chunks_read_ = 0;  // pushed so far; the total once input_done_
  int64_t next_ = 0;         // the chunk the writer needs next
  bool input_done_ = false;
  bool stop_ = false;
  std::exception_ptr reader_failure_;
};

void validate(const PreprocessArgs& a) {
  MEGATRON_CHECK(!a.input.empty(), "--input is required: the JSON-lines file to tokenize");
  MEGATRON_CHECK(!a.output_prefix.empty(),
                 "--output-prefix is required: outputs are <prefix>_<key>_document.bin/.idx");
  MEGATRON_CHECK(!a.keep_newlines || a.split_sentences,
                 "--keep-newlines applies to --split-sentences; add it or drop --keep-newlines");
  MEGATRON_CHECK(!a.json_keys.empty(), "--json-keys needs at least one key");
  for (size_t i = 0; i < a.json_keys.size(); ++i) {
    MEGATRON_CHECK(!a.json_keys[i].empty(), "--json-keys: a key is empty");
    for (size_t j = 0; j < i; ++j)
      MEGATRON_CHECK(a.json_keys[i] != a.json_keys[j], "--json-keys lists '", a.json_keys[i],
                     "' twice; each key writes its own dataset, list it once");
  }
  MEGATRON_CHECK(a.workers >= 0, "--workers is ", a.workers,
                 ", expected >= 1 (or 0 for one per available core)");
  MEGATRON_CHECK(a.log_interval >= 1, "--log-interval is ", a.log_interval, ", expected >= 1");
  MEGATRON_CHECK(a.partitions >= 1, "--partitions is ", a.partitions, ", expected >= 1");
  // preprocess_data.py's assertion (each partition's process takes workers / partitions).
  MEGATRON_CHECK(a.workers == 0 || a.workers % a.partitions == 0, "--workers (", a.workers,
                 ") must be a multiple of --partitions (", a.partitions, ")");
  MEGATRON_CHECK(!a.tokenizer.type.empty(),
                 "--tokenizer-type is required (GPT2BPETokenizer, HuggingFaceTokenizer, "
                 "SentencePieceTokenizer, BertWordPieceLowerCase, BertWordPieceCase, "
                 "TikTokenizer or NullTokenizer)");
}

void print_progress(int64_t docs, int64_t bytes, double elapsed) {
  // preprocess_data.py's line, on stderr as there.
  const double dt = std::max(elapsed, 1e-9);
  std::fprintf(stderr, "Processed %lld documents (%.2f docs/s, %.2f MB/s).\n",
               static_cast<long long>(docs), static_cast<double>(docs) / dt,
               static_cast<double>(bytes) / dt / 1024 / 1024);
  std::fflush(stderr);
}

// An input file opened for reading (closed when it goes).
struct InputFile {
  explicit InputFile(const std::string& path) {
    log_line("Opening " + path);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MEGATRON_CHECK(fd >= 0, "--input ", path, ": cannot open (", std::strerror(errno), ")");
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd); }
  int fd = -1;
};

// Tokenizes one JSON-lines file (opened as `in`) into <output_prefix>_<key>_<level>.bin/.idx.
void encode_file(const PreprocessArgs& a, const std::string& input, const InputFile& in,
                 const std::string& output_prefix, const Tokenizer& tokenizer,
                 const SentenceSplitter* splitter, const Timer& startup) {
  const int fd = in.fd;

  const char* level = a.split_sentences ? "sentence" : "document";
  const IndexDType dtype = index_dtype_for_vocab(tokenizer.vocab_size());
  std::vector<std::string> prefixes;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : a.json_keys) {
    prefixes.push_back(output_prefix + "_" + key + "_" + level);
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(prefixes.back() + ".bin", dtype));
  }
  log_line(strprintf("Time to startup: %.3f", startup.elapsed()));

  const Encoder encoder(a, tokenizer, splitter);
  Pipeline pipeline(a, encoder, fd, input);
  Timer clock;
  pipeline.start();
  int64_t docs = 0, bytes = 0;
  std::vector<int64_t> sequences(a.json_keys.size(), 0), tokens(a.json_keys.size(), 0);
  Encoded e;
  while (pipeline.next(e)) {
    const int64_t lines = static_cast<int64_t>(e.line_bytes.size());
    std::vector<size_t> seq(a.json_keys.size(), 0), tok(a.json_keys.size(), 0);
    for (int64_t j = 0; j < lines; ++j) {
      for (size_t k = 0; k < builders.size(); ++k) {
        const KeyOutput& o = e.keys[k];
        for (int32_t s = 0; s < o.sequences[static_cast<size_t>(j)]; ++s, ++seq[k]) {
          const size_t len = static_cast<size_t>(o.lengths[seq[k]]);
          builders[k]->add_item(std::span<const int64_t>(o.tokens.data() + tok[k], len));
          tok[k] += len;
        }
        builders[k]->end_document();
      }
      ++docs;
      bytes += e.line_bytes[static_cast<size_t>(j)];
      if (docs % a.log_interval == 0) print_progress(docs, bytes, clock.elapsed());
    }
    for (size_t k = 0; k < builders.size(); ++k) {
      sequences[k] += static_cast<int64_t>(seq[k]);
      tokens[k] += static_cast<int64_t>(tok[k]);
    }
    if (e.error_line >= 0) {
      const int64_t line_no = docs + 1;  // every earlier line became a document
      if (e.failure) {
        log_error(input + ":" + std::to_string(line_no) + ": failed while tokenizing");
        std::rethrow_exception(e.failure);
      }
      MEGATRON_CHECK(false, input, ":", line_no, ": ", e.error);
    }
  }
  for (size_t k = 0; k < builders.size(); ++k) builders[k]->finalize(prefixes[k] + ".idx");
  const double elapsed = std::max(clock.elapsed(), 1e-9);
  for (size_t k = 0; k < builders.size(); ++k) {
    log_line(strprintf("Wrote %s.{bin,idx}: %lld documents, %lld sequences, %lld tokens (%s)",
                       prefixes[k].c_str(), static_cast<long long>(docs),
                       static_cast<long long>(sequences[k]), static_cast<long long>(tokens[k]),
                       dtype == IndexDType::kUInt16 ? "uint16" : "int32"));
  }
  log_line(strprintf(
      "Done: %lld documents, %.1f MB in %.2f s (%.2f docs/s, %.2f MB/s) with %lld "
      "workers.",
      static_cast<long long>(docs), static_cast<double>(bytes) / 1024 / 1024, elapsed,
      static_cast<double>(docs) / elapsed, static_cast<double>(bytes) / elapsed / 1024 / 1024,
      static_cast<long long>(a.workers)));
}

}  // namespace

int preprocess_command(int argc, char** argv) {
  CLI::App app("Tokenize a JSON-lines file into Megatron indexed datasets (.bin/.idx)",
               "preprocess");
  PreprocessArgs a;
  a.tokenizer.type.clear();  // required here, as in preprocess_data.py
  ArgTable table(app);
  table.add("--input", a.input, "JSON-lines file, one JSON object (document) per line");
  app.add_option("--json-keys", a.json_keys,
                 "Keys whose values (a string or a list of strings) to tokenize; one dataset "
                 "per key")
      ->capture_default_str();
  table.add("--output-prefix", a.output_prefix, "Outputs are <prefix>_<key>_document.bin and .idx");
  table.flag("--append-eod", a.append_eod, "Append the tokenizer's EOD id to each document");
  table.flag("--split-sentences", a.split_sentences,
             "Split documents into sentences (ICU rules): outputs <prefix>_<key>_sentence");
  table.flag("--keep-newlines", a.keep_newlines,
             "With --split-sentences: sentences keep the whitespace and newlines after them");
  table.add("--workers", a.workers,
            "Tokenizing threads (0: one per available core); output does not depend on it");
  table.add("--log-interval", a.log_interval, "Documents between progress lines");
  table.add("--partitions", a.partitions,
            "Number of file partitions: with more than 1, --input is a glob whose files' lines "
            "are dealt round-robin into <input>_<i> files, each preprocessed to "
            "<output-prefix>_<i>_..., then merged (preprocess_data.py's order)");
  table.flag("--keep-sequential-samples", a.keep_sequential_samples,
             "With --partitions: contiguous runs of lines per partition, so the merged output "
             "keeps the input order");
  table.add("--lang", a.lang,
            "Language of NLTK's sentence splitter in preprocess_data.py; the splitter here "
            "applies ICU's sentence rules, which are the same for every language");
  table.add("--tokenizer-type", a.tokenizer.type,
            "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
            "BertWordPieceLowerCase, BertWordPieceCase, TikTokenizer or NullTokenizer");
  table.add("--vocab-file", a.tokenizer.vocab_file,
            "GPT-2 BPE vocabulary (encoder.json) or WordPiece vocab.txt");
  table.add("--vocab-extra-ids", a.tokenizer.vocab_extra_ids,
            "WordPiece: append <extra_id_0> .. <extra_id_{N-1}> (T5 sentinels)");
  table.add("--merge-file", a.tokenizer.merge_file, "GPT-2 BPE merges (vocab.bpe)");
  table.add("--tokenizer-model", a.tokenizer.tokenizer_model,
            "tokenizer.json, SentencePiece model or TikTokenizer vocabulary JSON");
  table.add("--vocab-size", a.tokenizer.vocab_size,
            "Vocabulary size (NullTokenizer; TikTokenizer, default 131072)");
  table.add("--tiktoken-pattern", a.tokenizer.tiktoken_pattern,
            "TikTokenizer's pre-tokenizer: v1 or v2");
  table.add("--tiktoken-num-special-tokens", a.tokenizer.tiktoken_num_special_tokens,
            "TikTokenizer: ids before the vocabulary held by special tokens");
  table.add("--tiktoken-special-tokens", a.tokenizer.tiktoken_special_tokens,
            "TikTokenizer's named special tokens, with <unk> <s> </s>");
  table.add("--null-tokenizer-eod-id", a.tokenizer.null_tokenizer_eod_id,
            "NullTokenizer's end-of-document id, which --append-eod writes (-1: --vocab-size - 1)");
  table.add("--null-tokenizer-pad-id", a.tokenizer.null_tokenizer_pad_id,
            "NullTokenizer's pad id (-1: none; training masks it)");
  bool no_special = false;
  table.flag("--tokenizer-hf-no-include-special-tokens", no_special,
             "HuggingFaceTokenizer: no post-processor tokens (a BOS, say) in the documents, as "
             "Megatron core 0.19's preprocess_data.py with this flag");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  a.tokenizer.hf_include_special_tokens = !no_special;
  validate(a);
  if (a.workers == 0) a.workers = available_cores();

  Timer startup;
  // The input is opened before the tokenizer loads, as preprocess_data.py reports a missing one
  // first (with --partitions the glob is expanded and dealt first).
  std::unique_ptr<InputFile> single;
  std::vector<PartitionFiles> parts;
  if (a.partitions == 1)
    single = std::make_unique<InputFile>(a.input);
  else
    parts = write_partitions(a.input, a.output_prefix, a.partitions, a.keep_sequential_samples);
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(a.tokenizer);
  std::unique_ptr<SentenceSplitter> splitter;
  if (a.split_sentences) splitter = std::make_unique<SentenceSplitter>(a.keep_newlines);
  if (a.tokenizer.type.rfind("BertWordPiece", 0) == 0 && !a.split_sentences)
    log_line("Are you sure you don't want to split sentences?");  // preprocess_data.py's warning
  if (single) {
    encode_file(a, a.input, *single, a.output_prefix, *tokenizer, splitter.get(), startup);
    return 0;
  }
  // preprocess_data.py's partitions: each partition file encoded to
  // <output-prefix>_<i>_<key>_<level>, then merged in partition order.
  for (const PartitionFiles& p : parts) {
    Timer part_startup;
    const InputFile in(p.input);
    encode_file(a, p.input, in, p.output_prefix, *tokenizer, splitter.get(), part_startup);
  }
  const char* level = a.split_sentences ? "sentence" : "document";
  const IndexDType dtype = index_dtype_for_vocab(tokenizer->vocab_size());
  for (const std::string& key : a.json_keys) {
    const std::string suffix = "_" + key + "_" + level;
    IndexedDatasetBuilder merged(a.output_prefix + suffix + ".bin", dtype);
    for (const PartitionFiles& p : parts)
      merged.add_index(IndexedDataset::open(p.output_prefix + suffix));
    merged.finalize(a.output_prefix + suffix + ".idx");
    log_line("Merged " + std::to_string(parts.size()) + " partitions into " + a.output_prefix +
             suffix + ".{bin,idx}");
  }
  return 0;
}

}  // namespace megatron::cli
