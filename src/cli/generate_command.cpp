// `megatron generate`: Megatron's static text generation from the command line. Prompts from
// --prompts or --prompt-file (one per line; a line holding a JSON object gives its "prompt" or
// "text"), generated in batches through the KV cache on one model replica in any TP x PP layout;
// rank 0 prints one JSON line per prompt, in order, with Megatron's response fields: "text"
// (prompt and generation), "tokens", "segments" and "logprobs". Loading lines and the prefill and
// decode speeds go to stderr, so stdout is the results alone. An encoder-decoder model (T5) takes
// each prompt as its encoder input, "<extra_id_N>" marking sentinels, and prints the decoder's
// generated text.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_args.h"
#include "cli/image_generation.h"
#include "cli/inference_model.h"
#include "cli/megatron_flags.h"
#include "cli/mpi_command.h"
#include "core/logging.h"
#include "inference/seq2seq_generator.h"
#include "models/t5/t5_chunk.h"
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

// A T5 prompt: the encoder's input, where "<extra_id_N>" stands for sentinel N (the tokenizer's
// --vocab-extra-ids tokens) and the text around the sentinels is tokenized as usual.
std::vector<int64_t> tokenize_t5_prompt(const Tokenizer& tokenizer, const std::string& prompt) {
  const std::vector<int64_t> sentinels = tokenizer.special_tokens().additional;
  const std::string open = "<extra_id_";
  std::vector<int64_t> ids;
  auto add_text = [&](std::string_view text) {
    for (int64_t id : tokenizer.encode(text)) ids.push_back(id);
  };
  size_t at = 0;
  while (true) {
    const size_t s = prompt.find(open, at);
    const size_t close = s == std::string::npos ? s : prompt.find('>', s);
    if (s == std::string::npos || close == std::string::npos) {
      add_text(std::string_view(prompt).substr(at));
      break;
    }
    const std::string digits = prompt.substr(s + open.size(), close - s - open.size());
    const bool number =
        !digits.empty() && digits.size() < 6 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!number) {  // not a sentinel: plain text up to and including this '<'
      add_text(std::string_view(prompt).substr(at, s + 1 - at));
      at = s + 1;
      continue;
    }
    const size_t n = std::stoul(digits);
    MEGATRON_CHECK(n < sentinels.size(), "prompt '", prompt, "': <extra_id_", n,
                   "> is not a sentinel of this tokenizer (it has ", sentinels.size(),
                   "; --vocab-extra-ids)");
    add_text(std::string_view(prompt).substr(at, s - at));
    ids.push_back(sentinels[n]);
    at = close + 1;
  }
  return ids;
}

// T5's decoder starts from [BOS] and stops at [EOS] (Megatron's WordPiece tokenizer adds them);
// a tokenizer without them (Hugging Face's T5) starts from the pad id and stops at its end id.
inference::Seq2SeqConfig seq2seq_config(const Tokenizer& tokenizer, int64_t max_batch) {
  const SpecialTokens sp = tokenizer.special_tokens();
  inference::Seq2SeqConfig c;
  c.vocab_size = tokenizer.vocab_size();
  c.pad = sp.pad >= 0 ? sp.pad : 0;
  c.start = sp.bos >= 0 ? sp.bos : c.pad;
  c.end = sp.eos >= 0 ? sp.eos : tokenizer.eod();
  c.max_batch = max_batch;
  return c;
}

// `megatron generate` for an encoder-decoder model: each prompt through the encoder, the
// decoder's tokens generated (inference/seq2seq_generator.h); rank 0 prints {"prompt", "text"
// (the generated tokens detokenized, without the end token), "tokens" (the generated ids) and
// "logprobs"} per prompt.
int run_seq2seq(const Arguments& args, const GenerationArgs& gen,
                const std::vector<std::string>& prompts, const inference::Seq2SeqRequest& request,
                MpiRuntime& mpi) {
  InferenceModel m = load_inference_model(args, mpi, false);
  const auto* chunk = dynamic_cast<const T5Chunk*>(m.chunk.get());
  MEGATRON_CHECK(chunk != nullptr, "--model ", args.model, " is not an encoder-decoder model");
  const inference::Seq2SeqConfig config = seq2seq_config(*m.tokenizer, max_batch_of(gen));
  const std::vector<inference::Seq2SeqResult> results =
      inference::generate_seq2seq(chunk->model(), request, config);
  if (mpi.rank() != 0) return 0;
  for (size_t i = 0; i < results.size(); ++i) {
    std::vector<int64_t> shown = results[i].tokens;
    if (!shown.empty() && shown.back() == config.end) shown.pop_back();
    nlohmann::json line = {{"prompt", prompts[i]},
                           {"text", m.tokenizer->decode(shown)},
                           {"tokens", results[i].tokens}};
    if (request.return_log_probs) line["logprobs"] = results[i].logprobs;
    std::puts(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  std::fflush(stdout);
  return 0;
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
            "File of prompts: one per line, or JSON lines with a \"prompt\" (or \"text\") string "
            "(--model llava: {\"prompt\", \"image\"})");
  std::vector<std::string> images;
  table.add("--images", images,
            "--model llava: one image file per --prompts entry (\"<image>\" in a prompt marks its "
            "place; else it comes first)");
  const MegatronCompatFlags compat(table, "generate");  // the rest of Megatron's flags
  std::vector<std::string> compat_lines;
  std::vector<ImagePrompt> image_requests;
  inference::GenerationRequest request;
  inference::Seq2SeqRequest seq2seq;
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    compat_lines = compat.resolve();
    resolve_generation_args(gen, table);
    resolve_inference_args(args, table, mpi.world_size(), false);
    MEGATRON_CHECK(prompts.empty() != prompt_file.empty(),
                   "give the prompts: --prompts P [P ...] or --prompt-file FILE, one of them");
    if (args.model == "llava") {
      image_requests = image_prompts(prompts, images, prompt_file);
      for (const ImagePrompt& p : image_requests) prompts.push_back(p.prompt);
      (void)sampling_of(gen, build_tokenizer(tokenizer_args(args))->vocab_size());
      return;
    }
    MEGATRON_CHECK(images.empty(), "--images belongs to vision-language models (--model llava)");
    if (!prompt_file.empty()) prompts = read_prompt_file(prompt_file);
    MEGATRON_CHECK(!prompts.empty(), "--prompt-file ", prompt_file, " holds no prompt");
    const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(tokenizer_args(args));
    if (args.model == "t5") {
      for (const std::string& p : prompts)
        seq2seq.prompts.push_back(tokenize_t5_prompt(*tokenizer, p));
      seq2seq.tokens_to_generate = gen.num_tokens_to_generate;
      seq2seq.return_log_probs = gen.return_log_probs;
      seq2seq.seed = static_cast<uint64_t>(gen.seed);
      seq2seq.sampling = sampling_of(gen, tokenizer->vocab_size());
      inference::check_seq2seq_request(seq2seq, transformer_config_from_args(args));
      return;
    }
    for (const std::string& p : prompts)
      request.prompts.push_back(tokenize_prompt(*tokenizer, p, false));
    request.tokens_to_generate = gen.num_tokens_to_generate;
    request.return_log_probs = gen.return_log_probs;
    request.seed = static_cast<uint64_t>(gen.seed);
    request.sampling = sampling_of(gen, tokenizer->vocab_size());
    const TransformerConfig cfg = transformer_config_from_args(args);
    inference::check_request(request,
                             generator_config(gen, *tokenizer, cfg.max_position_embeddings));
  });
  if (rc >= 0) return rc;
  if (mpi.rank() == 0) {
    for (const std::string& line : compat_lines) std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (args.model == "t5") return run_seq2seq(args, gen, prompts, seq2seq, mpi);
  if (args.model == "llava") return run_image_generation(args, gen, image_requests, mpi);
  const bool first = mpi.rank() == 0;
  InferenceModel m = load_inference_model(args, mpi, false);
  if (first) {
    std::fprintf(stderr, " > loaded %s; generating %zu prompt(s)\n",
                 (args.load.empty() ? args.pretrained_checkpoint : args.load).c_str(),
                 request.prompts.size());
  }
  const inference::Generator generator(
      *m.chunk, m.parallel->pp_group(),
      generator_config(gen, *m.tokenizer, m.config.max_position_embeddings));
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
