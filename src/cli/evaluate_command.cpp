// `megatron evaluate`: Megatron's zero-shot evaluation (tasks/main.py --task WIKITEXT103 or
// LAMBADA, r0.11) and multiple-choice scoring, on one model replica in any TP x PP layout. Prints
// Megatron's result block (" validation results on TASK | ...") and then one JSON line with the
// same numbers.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/inference_model.h"
#include "cli/megatron_flags.h"
#include "cli/mpi_command.h"
#include "core/logging.h"
#include "evaluation/detokenizer.h"
#include "evaluation/zero_shot.h"
#include "train/model_config.h"

namespace megatron::cli {

namespace {

using evaluation::Sample;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), "--valid-data: cannot open '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every line of a JSONL file as an object; errors name the file and line.
std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<nlohmann::json> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      MEGATRON_CHECK(false, path, ":", lineno, ": not valid JSON (", e.what(), ")");
    }
    MEGATRON_CHECK(out.back().is_object(), path, ":", lineno, ": expected a JSON object");
    out.back()["__line"] = lineno;
  }
  MEGATRON_CHECK(!out.empty(), "--valid-data ", path, " holds no example");
  return out;
}

// Python's repr of a float (what Megatron's f-string prints for the token ratio).
std::string python_float(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void print_block(const std::string& line) {
  const std::string bar(line.size() + 1, '-');
  log_line(bar + "\n" + line + "\n" + bar);
}

int run_evaluate(int argc, char** argv, MpiRuntime& mpi) {
  CLI::App app(
      "Zero-shot evaluation (Megatron's tasks/main.py): WikiText perplexity, LAMBADA "
      "accuracy, multiple choice",
      "evaluate");
  Arguments args;
  ArgTable table(app);
  register_inference_args(table, args);
  std::string task;
  std::vector<std::string> valid_data;
  int64_t overlapping_eval = 32, micro_batch = 1;
  bool strict_lambada = false;
  table.concern("evaluation");
  table.add("--task", task,
            "WIKITEXT103 (perplexity), LAMBADA (last-word accuracy) or "
            "MULTIPLE_CHOICE (log-likelihood of {context, choices, answer})");
  table.add("--valid-data", valid_data, "The task's file (raw text, or JSON lines)");
  table.add("--overlapping-eval", overlapping_eval,
            "WIKITEXT103: window stride; every target is scored once with at least seq-length "
            "minus this much context");
  table.flag("--strict-lambada", strict_lambada,
             "LAMBADA: the target is the whole last word, not its last token");
  table.add("--micro-batch-size", micro_batch, "Samples per forward");
  const MegatronCompatFlags compat(table, "evaluate");  // the rest of Megatron's flags
  std::vector<std::string> compat_lines;
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    compat_lines = compat.resolve();
    resolve_inference_args(args, table, mpi.world_size(), false);
    MEGATRON_CHECK(task == "WIKITEXT103" || task == "LAMBADA" || task == "MULTIPLE_CHOICE",
                   "--task '", task, "': use WIKITEXT103, LAMBADA or MULTIPLE_CHOICE");
    MEGATRON_CHECK(valid_data.size() == 1, "--valid-data: give exactly one file for ", task);
    MEGATRON_CHECK(overlapping_eval >= 1, "--overlapping-eval must be >= 1");
    MEGATRON_CHECK(micro_batch >= 1, "--micro-batch-size must be >= 1");
    MEGATRON_CHECK(args.seq_length >= 1 && args.seq_length <= args.max_position_embeddings,
                   "--seq-length ", args.seq_length, " must be in [1, --max-position-embeddings ",
                   args.max_position_embeddings, "]");
    read_file(valid_data.front());  // the file is there, on every rank
  });
  if (rc >= 0) return rc;
  const bool first = mpi.rank() == 0;
  if (first) {
    for (const std::string& line : compat_lines) log_line(line);
  }
  InferenceModel m = load_inference_model(args, mpi, false);
  const Tokenizer& tok = *m.tokenizer;
  const std::string& path = valid_data.front();
  const int64_t seq = args.seq_length;
  const evaluation::Scorer scorer(*m.chunk, m.parallel->pp_group(), tok.vocab_size(), micro_batch);
  nlohmann::json summary = {{"task", task}, {"valid_data", path}};
  std::string line = " validation results on " + task + " | ";
  if (task == "WIKITEXT103") {
    const std::string raw = read_file(path);
    std::string detok;
    const std::vector<int64_t> ids = tok.encode(evaluation::detokenize_for_path(path, raw, &detok));
    const int64_t original = evaluation::original_token_count(raw);
    MEGATRON_CHECK(ids.size() >= 2 && original >= 2, "--valid-data ", path,
                   ": too little text to evaluate (", ids.size(), " tokens)");
    if (first) {
      log_line(strprintf(" > number of original tokens: %ld, number of detokenized tokens: %zu",
                         static_cast<long>(original), ids.size()));
    }
    const std::vector<Sample> windows =
        evaluation::lm_windows(ids, seq, overlapping_eval, tok.eod());
    const evaluation::LmMetrics r = evaluation::lm_metrics(
        windows, scorer.score(windows), static_cast<int64_t>(ids.size()), original);
    line += strprintf("avg loss: %.4E | ppl: %.4E | adjusted ppl: %.4E | token ratio: %s |",
                      r.avg_loss, r.ppl, r.adjusted_ppl, python_float(r.token_ratio).c_str());
    summary.update({{"avg_loss", r.avg_loss},
                    {"ppl", r.ppl},
                    {"adjusted_ppl", r.adjusted_ppl},
                    {"token_ratio", r.token_ratio},
                    {"num_tokenized_tokens", r.tokenized},
                    {"num_original_tokens", r.original},
                    {"windows", windows.size()},
                    {"detokenizer", detok},
                    {"overlapping_eval", overlapping_eval}});
  } else if (task == "LAMBADA") {
    std::vector<Sample> samples;
    for (const nlohmann::json& j : read_jsonl(path)) {
      const auto lineno = j["__line"].get<int64_t>();
      MEGATRON_CHECK(j.contains("text") && j["text"].is_string(), path, ":", lineno,
                     ": needs a string \"text\"");
      try {
        samples.push_back(
            evaluation::lambada_sample(j["text"].get<std::string>(), tok, strict_lambada, seq));
      } catch (const InvalidArgument& e) {
        MEGATRON_CHECK(false, path, ":", lineno, ": ", e.what());
      }
    }
    if (first) log_line(strprintf(" > found %zu samples.", samples.size()));
    const evaluation::AccuracyMetrics r =
        evaluation::lambada_metrics(samples, scorer.score(samples));
    line += strprintf("number correct: %.4E | total examples: %.4E | avg accuracy: %.4E",
                      static_cast<double>(r.correct), static_cast<double>(r.total), r.accuracy());
    summary.update({{"correct", r.correct},
                    {"total", r.total},
                    {"accuracy", r.accuracy()},
                    {"strict", strict_lambada}});
  } else {
    std::vector<evaluation::ChoiceItem> items;
    std::vector<Sample> all;
    for (const nlohmann::json& j : read_jsonl(path)) {
      const auto lineno = j["__line"].get<int64_t>();
      const bool ok = j.contains("context") && j["context"].is_string() && j.contains("choices") &&
                      j["choices"].is_array() && j.contains("answer") &&
                      j["answer"].is_number_integer();
      MEGATRON_CHECK(ok, path, ":", lineno,
                     ": needs {\"context\": string, \"choices\": [strings], \"answer\": index}");
      std::vector<std::string> choices;
      for (const nlohmann::json& c : j["choices"]) {
        MEGATRON_CHECK(c.is_string(), path, ":", lineno, ": every choice must be a string");
        choices.push_back(c.get<std::string>());
      }
      try {
        items.push_back(evaluation::choice_item(j["context"].get<std::string>(), choices,
                                                j["answer"].get<int64_t>(), tok, seq));
      } catch (const InvalidArgument& e) {
        MEGATRON_CHECK(false, path, ":", lineno, ": ", e.what());
      }
      for (const Sample& s : items.back().choices) all.push_back(s);
    }
    evaluation::AccuracyMetrics acc, acc_norm;
    evaluation::choice_metrics(items, scorer.score(all), &acc, &acc_norm);
    line += strprintf(
        "number correct: %.4E | total examples: %.4E | avg accuracy: %.4E | "
        "avg accuracy (length-normalized): %.4E",
        static_cast<double>(acc.correct), static_cast<double>(acc.total), acc.accuracy(),
        acc_norm.accuracy());
    summary.update({{"correct", acc.correct},
                    {"total", acc.total},
                    {"accuracy", acc.accuracy()},
                    {"correct_norm", acc_norm.correct},
                    {"accuracy_norm", acc_norm.accuracy()}});
  }
  if (first) {
    print_block(line);
    log_line(summary.dump());
    log_line("done :-)");
  }
  return 0;
}

}  // namespace

int evaluate_command(int argc, char** argv) {
  MpiRuntime mpi;
  return run_mpi_command(mpi, [&](MpiRuntime& m) { return run_evaluate(argc, argv, m); });
}

}  // namespace megatron::cli
