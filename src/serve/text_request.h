// What a client asks the text-generation server for, parsed and checked: Megatron's PUT /api
// fields (megatron/inference/text_generation_server.py) and its OpenAI-style POST /completions
// (megatron/inference/endpoints/completions.py), with their defaults and their messages.
//
// One deviation, on purpose: Megatron answers most field errors with its message and HTTP 200
// (Flask-RESTful's default for a returned string); here every refusal is a 4xx with the message in
// {"message": ...}, which Megatron's own CLI client prints ("Error <code>: <message>").
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "inference/generator.h"

namespace megatron::serve {

// A request the server does not accept: its HTTP status and the reason.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

enum class Endpoint { kApi, kCompletions };

struct TextRequest {
  Endpoint endpoint = Endpoint::kApi;
  std::vector<std::string> prompts;              // text prompts, or
  std::vector<std::vector<int64_t>> prompt_ids;  // token-id prompts (completions only)
  bool add_bos = false;                          // the end-of-document id first (add_BOS)
  int64_t random_seed = -1;                      // -1: the server draws one
  bool no_log = false;
  // Everything of the generation but the prompts and the seed.
  inference::GenerationRequest generation;
  // Completions: echo the prompt, cut the text at the first of `stop` (empty: the tokenizer's
  // end-of-document text), the top-n log-probabilities asked for.
  bool echo = false;
  std::vector<std::string> stop;
  bool stop_given = false;
};

// The most prompts one PUT /api carries (Megatron's limit).
inline constexpr size_t kMaxPrompts = 128;

// PUT /api. Throws RequestError (400) with Megatron's message for the first rule broken.
TextRequest parse_api_request(const nlohmann::json& body);
// POST /completions. Throws RequestError (400).
TextRequest parse_completions_request(const nlohmann::json& body);

// The body of an error response.
std::string error_body(const std::string& message);

// A generation request as text and back: what rank 0 broadcasts to the ranks that follow it.
std::string encode_generation(const inference::GenerationRequest& g);
inference::GenerationRequest decode_generation(const std::string& text);

}  // namespace megatron::serve
