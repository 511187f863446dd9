// `megatron serve`: Megatron's text-generation server (tools/run_text_generation_server.py).
// Rank 0 (the first pipeline stage's TP rank 0) serves HTTP (serve/text_generation_server.h);
// for every batch of requests it broadcasts the generation to the other ranks, which follow it
// through the same generate() call, as Megatron's ranks follow the server's broadcast "choice".
// SIGTERM drains: queued and running requests are answered, then every rank exits 0.
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_args.h"
#include "cli/inference_model.h"
#include "cli/megatron_flags.h"
#include "cli/mpi_command.h"
#include "comm/agreement.h"
#include "core/logging.h"
#include "serve/text_generation_server.h"
#include "train/exit_signal.h"
#include "train/model_config.h"

namespace megatron::cli {

namespace {

constexpr const char* kStop = "stop";
using inference::GenerationRequest;
using inference::GenerationResult;
using serve::Response;
using serve::TextRequest;

// Character offsets of each token's text in the detokenized sequence (the length of the text of
// the tokens before it).
std::vector<int64_t> text_offsets(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int64_t> out;
  for (size_t k = 0; k < ids.size(); ++k) {
    out.push_back(static_cast<int64_t>(tok.decode(std::span(ids.data(), k)).size()));
  }
  return out;
}

nlohmann::json api_response(const Tokenizer& tok, const std::vector<GenerationResult>& results,
                            bool logprobs) {
  nlohmann::json text = nlohmann::json::array(), tokens = nlohmann::json::array(),
                 segments = nlohmann::json::array(), lps = nlohmann::json::array();
  for (const GenerationResult& r : results) {
    const ResultText t = detokenize(tok, r);
    text.push_back(t.text);
    tokens.push_back(r.tokens);
    segments.push_back(t.segments);
    lps.push_back(r.logprobs);
  }
  nlohmann::json out = {{"text", text}, {"tokens", tokens}, {"segments", segments}};
  if (logprobs) out["logprobs"] = lps;
  return out;
}

// The OpenAI-style choice of one prompt: the generation (with echo: prompt and generation) cut at
// the first stop string, its tokens, their log-probabilities (null for the very first token,
// which has no context) and their text offsets.
nlohmann::json completion_choice(const Tokenizer& tok, const TextRequest& req,
                                 const GenerationResult& r, int64_t index) {
  const std::string full = tok.decode(r.tokens);
  const std::vector<int64_t> offsets = text_offsets(tok, r.tokens);
  const auto n = static_cast<int64_t>(r.tokens.size());
  const int64_t tok_start = req.echo ? 0 : r.prompt_length;
  const size_t start = tok_start < n ? static_cast<size_t>(offsets[tok_start]) : full.size();
  std::vector<std::string> stops = req.stop;
  if (!req.stop_given) stops.push_back(tok.decode(std::vector<int64_t>{tok.eod()}));
  size_t end = full.size();
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t at = full.find(s, start);
    if (at != std::string::npos) end = std::min(end, at);
  }
  int64_t tok_end = tok_start;
  while (tok_end < n && static_cast<size_t>(offsets[tok_end]) < end) ++tok_end;
  nlohmann::json tokens = nlohmann::json::array(), lps = nlohmann::json::array(),
                 at = nlohmann::json::array(), top = nlohmann::json::array();
  for (int64_t k = tok_start; k < tok_end; ++k) {
    tokens.push_back(tok.decode(std::span(&r.tokens[static_cast<size_t>(k)], 1)));
    lps.push_back(k == 0 ? nlohmann::json() : nlohmann::json(r.logprobs[k - 1]));
    at.push_back(offsets[k]);
    if (!r.top_logprobs.empty()) {
      nlohmann::json best = nlohmann::json::object();
      if (k > 0) {
        for (const auto& [id, lp] : r.top_logprobs[static_cast<size_t>(k - 1)]) {
          best[tok.decode(std::vector<int64_t>{id})] = lp;
        }
      }
      top.push_back(k == 0 ? nlohmann::json() : best);
    }
  }
  return {{"index", index},
          {"text", full.substr(start, end - start)},
          {"logprobs",
           {{"token_logprobs", lps},
            {"tokens", tokens},
            {"text_offset", at},
            {"top_logprobs", r.top_logprobs.empty() ? nlohmann::json() : top}}}};
}

// Rank 0's runner: tokenizes and checks each request (a refusal answers that request alone),
// merges the rest into one generation, has every rank run it, and answers each request.
class Runner {
 public:
  Runner(const InferenceModel& m, const inference::Generator& g) : m_(m), generator_(g) {}

  std::vector<Response> operator()(const std::vector<TextRequest>& requests) {
    std::vector<Response> out(requests.size());
    GenerationRequest merged;
    std::vector<std::pair<size_t, size_t>> spans(requests.size());  // [first, count) in merged
    std::vector<bool> ok(requests.size(), false);
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        GenerationRequest g = prepare(requests[i]);
        inference::check_request(g, generator_.config());
        if (merged.prompts.empty()) merged = g, merged.prompts.clear(), merged.streams.clear();
        spans[i] = {merged.prompts.size(), g.prompts.size()};
        for (size_t p = 0; p < g.prompts.size(); ++p) {
          merged.prompts.push_back(g.prompts[p]);
          merged.streams.push_back(g.streams[p]);
        }
        ok[i] = true;
      } catch (const InvalidArgument& e) {
        out[i] = Response{400, serve::error_body(e.what())};
      }
    }
    if (merged.prompts.empty()) return out;
    std::string command = serve::encode_generation(merged);
    broadcast_string(m_.parallel->world_group(), command, 0);
    const std::vector<GenerationResult> results = generator_.generate(merged);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!ok[i]) continue;
      const std::vector<GenerationResult> mine(results.begin() + spans[i].first,
                                               results.begin() + spans[i].first + spans[i].second);
      nlohmann::json body;
      if (requests[i].endpoint == serve::Endpoint::kApi) {
        body = api_response(*m_.tokenizer, mine, requests[i].generation.return_log_probs);
      } else {
        body = {{"choices", nlohmann::json::array()}};
        for (size_t k = 0; k < mine.size(); ++k) {
          body["choices"].push_back(
              completion_choice(*m_.tokenizer, requests[i], mine[k], static_cast<int64_t>(k)));
        }
      }
      out[i] = Response{200, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
    }
    return out;
  }

 private:
  GenerationRequest prepare(const TextRequest& r) {
    GenerationRequest g = r.generation;
    const Tokenizer& tok = *m_.tokenizer;
    for (const std::string& p : r.prompts) g.prompts.push_back(tokenize_prompt(tok, p, r.add_bos));
    for (const std::vector<int64_t>& ids : r.prompt_ids) {
      std::vector<int64_t> p;
      if (r.add_bos) p.push_back(tok.eod());
      p.insert(p.end(), ids.begin(), ids.end());
      g.prompts.push_back(std::move(p));
    }
    const uint64_t seed = r.random_seed >= 0 ? static_cast<uint64_t>(r.random_seed)
                                             : (static_cast<uint64_t>(random_()) << 32) | random_();
    for (size_t p = 0; p < g.prompts.size(); ++p) g.streams.push_back({seed, p});
    if (g.prevent_newline_after_colon) {
      const std::vector<int64_t> colon = tok.encode(":"), newline = tok.encode("\n");
      g.colon_id = colon.empty() ? -1 : colon.front();
      g.newline_id = newline.empty() ? -1 : newline.front();
    }
    return g;
  }

  const InferenceModel& m_;
  const inference::Generator& generator_;
  std::random_device random_;
};

int run_serve(int argc, char** argv, MpiRuntime& mpi) {
  CLI::App app("Serve text generation over HTTP (Megatron's text-generation server)", "serve");
  Arguments args;
  GenerationArgs gen;
  serve::ServerOptions options;
  ArgTable table(app);
  register_inference_args(table, args);
  register_generation_args(table, gen);
  table.concern("server");
  table.add("--host", options.host,
            "Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  int64_t port = options.port, max_bytes = static_cast<int64_t>(options.max_body_bytes);
  bool no_batching = false;
  table.add("--port", port, "Port for the text generation server to run on (0: any free port)");
  table.add("--max-queued-requests", options.max_queued,
            "Requests that may wait for the model; more are answered 503");
  table.add("--request-timeout", options.timeout_s,
            "Seconds a request may wait and run before it is answered 504");
  table.add("--max-request-bytes", max_bytes, "Largest request body accepted (else 413)");
  table.flag("--no-request-batching", no_batching,
             "Serve requests one at a time (Megatron's lock) instead of batching those with the "
             "same generation settings");
  const MegatronCompatFlags compat(table, "serve");  // the rest of Megatron's flags
  std::vector<std::string> compat_lines;
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    compat_lines = compat.resolve();
    resolve_generation_args(gen, table);
    resolve_inference_args(args, table, mpi.world_size(), false);
    MEGATRON_CHECK(port >= 0 && port <= 65535, "--port ", port, " must be in [0, 65535]");
    MEGATRON_CHECK(options.max_queued >= 1, "--max-queued-requests must be >= 1");
    MEGATRON_CHECK(options.timeout_s > 0, "--request-timeout must be positive");
    MEGATRON_CHECK(max_bytes >= 1024, "--max-request-bytes must be at least 1024");
  });
  if (rc >= 0) return rc;
  if (mpi.rank() == 0) {
    for (const std::string& line : compat_lines) log_line(line);
  }
  options.port = static_cast<int>(port);
  options.max_body_bytes = static_cast<size_t>(max_bytes);
  options.batching = !no_batching;
  const ExitSignalHandler sigterm(SIGTERM);
  InferenceModel m = load_inference_model(args, mpi, false);
  const inference::Generator generator(
      *m.chunk, m.parallel->pp_group(),
      generator_config(gen, *m.tokenizer, m.config.max_position_embeddings));
  if (mpi.rank() != 0) {
    for (;;) {  // follow rank 0's broadcasts
      std::string command;
      broadcast_string(m.parallel->world_group(), command, 0);
      if (command == kStop) return 0;
      generator.generate(serve::decode_generation(command));
    }
  }
  Runner runner(m, generator);
  serve::TextGenerationServer server(options,
                                     [&](const std::vector<TextRequest>& r) { return runner(r); });
  // A failed bind stops the followers too.
  std::string bind_error;
  try {
    server.bind();
  } catch (const InvalidArgument& e) {
    bind_error = e.what();
  }
  if (!bind_error.empty()) {
    std::string stop = kStop;
    broadcast_string(m.parallel->world_group(), stop, 0);
    throw InvalidArgument(bind_error);
  }
  log_line(strprintf(" > serving %s on http://%s:%d (PUT /api, POST /completions, GET /health)",
                     (args.load.empty() ? args.pretrained_checkpoint : args.load).c_str(),
                     options.host.c_str(), server.port()));
  server.serve([&] { return sigterm.received(); });
  std::string stop = kStop;
  broadcast_string(m.parallel->world_group(), stop, 0);
  log_line(strprintf(" > server stopped after %ld requests", static_cast<long>(server.answered())));
  return 0;
}

}  // namespace

int serve_command(int argc, char** argv) {
  MpiRuntime mpi;
  return run_mpi_command(mpi, [&](MpiRuntime& m) { return run_serve(argc, argv, m); });
}

}  // namespace megatron::cli
