// `megatron generate`: Megatron's static text generation from the command line. Prompts from
// --prompts or --prompt-file (one per line; a line holding a JSON object gives its "prompt" or
// "text"), generated in batches through the KV cache on one model replica in any TP x PP layout;
// rank 0 prints one JSON line per prompt, in order, with Megatron's response fields: "text"
// (prompt and generation), "tokens", "segments" and "logprobs". Loading lines and the prefill and
// decode speeds go to stderr, so stdout is the results alone.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_args.h"
#include "cli/inference_model.h"
#include "cli/mpi_command.h"
#include "core/logging.h"
#include "train/model_config.h"
#include "train/trainer.h"  // tokenizer_args

namespace megatron::cli {

namespace {

// The prompts of --prompt-file: a line that is a JSON object gives its "prompt" (or "text").
std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  MEGATRON_CHECK(in.good(), "--prompt-file: cannot open '", path, "'");
  std::vector<std::string> prompts;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.front() == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        MEGATRON_CHECK(false, path, ":", lineno, ": not valid JSON (", e.what(), ")");
      }
      const char* key = j.contains("prompt") ? "prompt" : "text";
      MEGATRON_CHECK(j.is_object() && j.contains(key) && j[key].is_string(), path, ":", lineno,
                     ": a JSON line needs a string \"prompt\" (or \"text\")");
      prompts.push_back(j[key].get<std::string>());
    } else {
      prompts.push_back(line);
    }
  }
  return prompts;
}

int run_generate(int argc, char** argv, MpiRuntime& mpi) {
  CLI::App app("Generate text from prompts (Megatron's static inference)", "generate");
  Arguments args;
  GenerationArgs gen;
  ArgTable table(app);
  register_inference_args(table, args);
  register_generation_args(table, gen);
  std::vector<std::string> prompts;
  std::string prompt_file;
  table.concern("text generation");
  table.add("--prompts", prompts, "Prompts, each one argument");
  table.add("--prompt-file", prompt_file,
            "File of prompts: one per line, or JSON lines with a \"prompt\" (or \"text\") string");
  inference::GenerationRequest request;
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    resolve_inference_args(args, table, mpi.world_size(), false);
    MEGATRON_CHECK(prompts.empty() != prompt_file.empty(),
                   "give the prompts: --prompts P [P ...] or --prompt-file FILE, one of them");
    if (!prompt_file.empty()) prompts = read_prompt_file(prompt_file);
    MEGATRON_CHECK(!prompts.empty(), "--prompt-file ", prompt_file, " holds no prompt");
    const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(tokenizer_args(args));
    for (const std::string& p : prompts)
      request.prompts.push_back(tokenize_prompt(*tokenizer, p, false));
    request.tokens_to_generate = gen.num_tokens_to_generate;
    request.return_log_probs = gen.return_log_probs;
    request.seed = static_cast<uint64_t>(gen.seed);
    request.sampling = sampling_of(gen, tokenizer->vocab_size());
    const TransformerConfig cfg = transformer_config_from_args(args);
    inference::check_request(
        request, inference::GeneratorConfig{tokenizer->vocab_size(), tokenizer->eod(),
                                            cfg.max_position_embeddings, max_batch_of(gen)});
  });
  if (rc >= 0) return rc;
  const bool first = mpi.rank() == 0;
  InferenceModel m = load_inference_model(args, mpi, false);
  if (first) {
    std::fprintf(stderr, " > loaded %s; generating %zu prompt(s)\n",
                 (args.load.empty() ? args.pretrained_checkpoint : args.load).c_str(),
                 request.prompts.size());
  }
  const inference::Generator generator(
      *m.chunk, m.parallel->pp_group(),
      inference::GeneratorConfig{m.tokenizer->vocab_size(), m.tokenizer->eod(),
                                 m.config.max_position_embeddings, max_batch_of(gen)});
  std::vector<inference::BatchTimes> times;
  const std::vector<inference::GenerationResult> results = generator.generate(request, &times);
  if (!first) return 0;
  // Positions per second of each phase (b x positions the model ran, as BatchTimes counts).
  auto rate = [](int64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
  for (size_t i = 0; i < times.size(); ++i) {
    const inference::BatchTimes& t = times[i];
    if (t.prefill_positions == 0) continue;  // scoring (no new tokens): no generation steps
    std::fprintf(stderr,
                 " > batch %zu (%ld prompts): prefill %ld positions in %.4f s (%.1f tokens/s), "
                 "decode %ld positions in %.4f s (%.1f tokens/s)\n",
                 i + 1, static_cast<long>(t.prompts), static_cast<long>(t.prefill_positions),
                 t.prefill_seconds, rate(t.prefill_positions, t.prefill_seconds),
                 static_cast<long>(t.decode_positions), t.decode_seconds,
                 rate(t.decode_positions, t.decode_seconds));
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const ResultText t = detokenize(*m.tokenizer, results[i]);
    nlohmann::json line = {{"prompt", prompts[i]},
                           {"text", t.text},
                           {"tokens", results[i].tokens},
                           {"segments", t.segments}};
    if (request.return_log_probs) line["logprobs"] = results[i].logprobs;
    std::puts(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int generate_command(int argc, char** argv) {
  MpiRuntime mpi;
  return run_mpi_command(mpi, [&](MpiRuntime& m) { return run_generate(argc, argv, m); });
}

}  // namespace megatron::cli
