// Megatron's request validation, rule by rule in its order (text_request.h).
#include "serve/text_request.h"

namespace megatron::serve {

namespace {

[[noreturn]] void refuse(const std::string& message, int status = 400) {
  throw RequestError(status, message);
}

bool is_int(const nlohmann::json& v) {
  return v.is_number_integer();
}
bool is_number(const nlohmann::json& v) {
  return v.is_number() && !v.is_boolean();
}

}  // namespace

std::string error_body(const std::string& message) {
  return nlohmann::json{{"message", message}}.dump(-1, ' ', false,
                                                   nlohmann::json::error_handler_t::replace);
}

TextRequest parse_api_request(const nlohmann::json& j) {
  if (!j.is_object()) refuse("the request body must be a JSON object");
  TextRequest r;
  r.endpoint = Endpoint::kApi;
  inference::GenerationRequest& g = r.generation;
  if (!j.contains("prompts")) refuse("prompts argument required");
  if (j.contains("max_len")) refuse("max_len is no longer used.  Replace with tokens_to_generate");
  if (j.contains("sentences")) refuse("sentences is no longer used.  Replace with prompts");
  const nlohmann::json& prompts = j["prompts"];
  if (!prompts.is_array()) refuse("prompts is not a list of strings");
  if (prompts.empty()) refuse("prompts is empty");
  if (prompts.size() > kMaxPrompts) refuse("Maximum number of prompts is 128");
  for (const nlohmann::json& p : prompts) {
    if (!p.is_string()) refuse("prompts is not a list of strings");
    r.prompts.push_back(p.get<std::string>());
  }
  g.tokens_to_generate = 64;  // Megatron's default: "hopefully sane; full sequence is slow"
  if (j.contains("tokens_to_generate")) {
    const nlohmann::json& v = j["tokens_to_generate"];
    if (!is_int(v)) refuse("tokens_to_generate must be an integer greater than 0");
    g.tokens_to_generate = v.get<int64_t>();
    if (g.tokens_to_generate < 0) {
      refuse("tokens_to_generate must be an integer greater than or equal to 0");
    }
  }
  g.return_log_probs = false;
  if (j.contains("logprobs")) {
    if (!j["logprobs"].is_boolean()) refuse("logprobs must be a boolean value");
    g.return_log_probs = j["logprobs"].get<bool>();
  }
  if (g.tokens_to_generate == 0 && !g.return_log_probs) {
    refuse("tokens_to_generate=0 implies logprobs should be True");
  }
  double temperature = 1.0;
  if (j.contains("temperature")) {
    if (!is_number(j["temperature"])) {
      refuse("temperature must be a positive number less than or equal to 1000.0");
    }
    temperature = j["temperature"].get<double>();
    if (!(temperature > 0.0 && temperature <= 100.0)) {
      refuse("temperature must be a positive number less than or equal to 100.0");
    }
  }
  int64_t top_k = 0;
  if (j.contains("top_k")) {
    if (!is_int(j["top_k"])) {
      refuse("top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
    }
    top_k = j["top_k"].get<int64_t>();
    if (!(top_k >= 0 && top_k <= 1000)) {
      refuse("top_k must be equal to or greater than 0 and less than or equal to 1000");
    }
  }
  double top_p = 0.0;
  if (j.contains("top_p")) {
    if (!j["top_p"].is_number_float()) {
      refuse("top_p must be a positive float less than or equal to 1.0");
    }
    top_p = j["top_p"].get<double>();
    if (top_p > 0.0 && top_k > 0) refuse("cannot set both top-k and top-p samplings.");
    if (!(top_p >= 0.0 && top_p <= 1.0)) refuse("top_p must be less than or equal to 1.0");
  }
  if (j.contains("top_p_decay")) {
    if (!j["top_p_decay"].is_number_float()) {
      refuse("top_p_decay must be a positive float less than or equal to 1.0");
    }
    const double d = j["top_p_decay"].get<double>();
    if (top_p == 0.0) refuse("top_p_decay cannot be set without top_p");
    if (!(d >= 0.0 && d <= 1.0)) refuse("top_p_decay must be less than or equal to 1.0");
    g.top_p_decay = static_cast<float>(d);
  }
  if (j.contains("top_p_bound")) {
    if (!j["top_p_bound"].is_number_float()) {
      refuse("top_p_bound must be a positive float less than or equal to top_p");
    }
    const double b = j["top_p_bound"].get<double>();
    if (top_p == 0.0) refuse("top_p_bound cannot be set without top_p");
    if (!(b > 0.0 && b <= top_p)) refuse("top_p_bound must be greater than 0 and less than top_p");
    g.top_p_bound = static_cast<float>(b);
  }
  auto boolean = [&](const char* key, bool& field) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean()) refuse(std::string(key) + " must be a boolean value");
    field = j[key].get<bool>();
  };
  boolean("add_BOS", r.add_bos);
  for (const std::string& p : r.prompts) {
    if (p.empty() && !r.add_bos) refuse("Empty prompts require add_BOS=true");
  }
  boolean("stop_on_double_eol", g.stop_on_double_eol);
  boolean("stop_on_eol", g.stop_on_eol);
  boolean("prevent_newline_after_colon", g.prevent_newline_after_colon);
  if (j.contains("random_seed")) {
    if (!is_int(j["random_seed"])) refuse("random_seed must be integer");
    r.random_seed = j["random_seed"].get<int64_t>();
    if (r.random_seed < 0) refuse("random_seed must be a positive integer");
  }
  boolean("no_log", r.no_log);
  if (j.contains("beam_width")) {
    if (!is_int(j["beam_width"])) refuse("beam_width must be integer");
    if (j["beam_width"].get<int64_t>() < 1) refuse("beam_width must be an integer > 1");
    if (r.prompts.size() > 1) refuse("When doing beam_search, batch size must be 1");
    refuse("beam_width: beam search is not supported by this server; drop the field to sample");
  }
  if (j.contains("stop_token") && !is_int(j["stop_token"])) refuse("stop_token must be an integer");
  if (j.contains("length_penalty") && !j["length_penalty"].is_number_float()) {
    refuse("length_penalty must be a float");
  }
  g.sampling =
      inference::SamplingParams{static_cast<float>(temperature), top_k, static_cast<float>(top_p)};
  return r;
}

TextRequest parse_completions_request(const nlohmann::json& j) {
  if (!j.is_object()) refuse("the request body must be a JSON object");
  TextRequest r;
  r.endpoint = Endpoint::kCompletions;
  inference::GenerationRequest& g = r.generation;
  if (!j.contains("prompt")) refuse("prompt is required");
  const nlohmann::json& p = j["prompt"];
  auto id_list = [](const nlohmann::json& v) {
    if (!v.is_array() || v.empty()) return false;
    for (const nlohmann::json& x : v)
      if (!x.is_number_integer()) return false;
    return true;
  };
  if (p.is_string()) {
    r.prompts.push_back(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p.front().is_string()) {
    for (const nlohmann::json& x : p) {
      if (!x.is_string()) refuse("Unknown prompt type: a list mixing strings and others");
      r.prompts.push_back(x.get<std::string>());
    }
  } else if (id_list(p)) {
    r.prompt_ids.push_back(p.get<std::vector<int64_t>>());
  } else if (p.is_array() && !p.empty() && p.front().is_array()) {
    for (const nlohmann::json& x : p) {
      if (!id_list(x)) refuse("Unknown prompt type: a list of token-id lists needs every item so");
      r.prompt_ids.push_back(x.get<std::vector<int64_t>>());
    }
  } else if (p.is_array() && p.empty()) {
    refuse("prompt contains no items: []");
  } else {
    refuse(
        "Unknown prompt type: a string, a list of strings, a list of token ids or a list of "
        "such lists");
  }
  if (r.prompts.size() + r.prompt_ids.size() > kMaxPrompts) {
    refuse("Maximum number of prompts is 128");
  }
  if (!j.contains("max_tokens") || !is_int(j["max_tokens"]) || j["max_tokens"].get<int64_t>() < 0) {
    refuse("max_tokens is required: an integer >= 0");
  }
  g.tokens_to_generate = j["max_tokens"].get<int64_t>();
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    if (!is_number(j[key])) refuse(std::string(key) + " must be a number");
    return j[key].get<double>();
  };
  auto integer = [&](const char* key, int64_t fallback) {
    if (!j.contains(key)) return fallback;
    if (!is_int(j[key])) refuse(std::string(key) + " must be an integer");
    return j[key].get<int64_t>();
  };
  double temperature = number("temperature", 1.0);
  int64_t top_k = integer("top_k", 0);
  double top_p = number("top_p", 1.0);
  g.top_n_logprobs = integer("logprobs", 0);
  if (j.contains("echo")) {
    if (!j["echo"].is_boolean()) refuse("echo must be a boolean value");
    r.echo = j["echo"].get<bool>();
  }
  r.random_seed = integer("seed", -1);
  if (j.contains("seed") && r.random_seed < 0) refuse("seed must be a positive integer");
  const int64_t best_of = integer("best_of", 1), n = integer("n", 1);
  if (j.contains("stop") && !j["stop"].is_null()) {
    r.stop_given = true;
    if (j["stop"].is_string()) {
      r.stop.push_back(j["stop"].get<std::string>());
    } else if (j["stop"].is_array()) {
      for (const nlohmann::json& s : j["stop"]) {
        if (!s.is_string()) refuse("stop must be a string or a list of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      refuse("stop must be a string or a list of strings");
    }
  }
  if (temperature == 0) {  // the OpenAI API's greedy
    top_k = 1;
    top_p = 0;
    temperature = 1.0;
  }
  if (!r.echo && g.tokens_to_generate == 0) {
    refuse("echo=False not supported when tokens_to_generate == 0");
  }
  if (best_of > 1) refuse("best_of > 1 not supported");
  if (n > 1) refuse("num_completions > 1 not supported");
  if (g.tokens_to_generate > 0 && g.top_n_logprobs > 0) {
    refuse("cannot return top-k unless tokens_to_generate=0 at this time");
  }
  if (g.top_n_logprobs > 10) refuse("return_topk_logprobs > 10 not supported");
  if (g.top_n_logprobs < 0) refuse("logprobs must be an integer >= 0");
  if (!(temperature > 0.0 && temperature <= 100.0)) {
    refuse("temperature must be a positive number less than or equal to 100.0");
  }
  if (!(top_k >= 0 && top_k <= 1000)) {
    refuse("top_k must be equal to or greater than 0 and less than or equal to 1000");
  }
  if (!(top_p >= 0.0 && top_p <= 1.0)) refuse("top_p must be less than or equal to 1.0");
  // top_p's default 1.0 keeps every token: with a top_k it is no filter at all, so it yields.
  if (top_k > 0 && top_p >= 1.0) top_p = 0.0;
  if (top_p > 0.0 && top_k > 0) refuse("cannot set both top-k and top-p samplings.");
  g.return_log_probs = true;
  g.sampling =
      inference::SamplingParams{static_cast<float>(temperature), top_k, static_cast<float>(top_p)};
  return r;
}

std::string encode_generation(const inference::GenerationRequest& g) {
  nlohmann::json streams = nlohmann::json::array();
  for (const auto& st : g.streams) streams.push_back({st.seed, st.stream});
  return nlohmann::json{{"prompts", g.prompts},
                        {"tokens_to_generate", g.tokens_to_generate},
                        {"temperature", g.sampling.temperature},
                        {"top_k", g.sampling.top_k},
                        {"top_p", g.sampling.top_p},
                        {"return_log_probs", g.return_log_probs},
                        {"seed", g.seed},
                        {"streams", streams},
                        {"stop_on_eod", g.stop_on_eod},
                        {"top_n_logprobs", g.top_n_logprobs},
                        {"top_p_decay", g.top_p_decay},
                        {"top_p_bound", g.top_p_bound},
                        {"stop_on_eol", g.stop_on_eol},
                        {"stop_on_double_eol", g.stop_on_double_eol},
                        {"prevent_newline_after_colon", g.prevent_newline_after_colon},
                        {"colon_id", g.colon_id},
                        {"newline_id", g.newline_id}}
      .dump();
}

inference::GenerationRequest decode_generation(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  inference::GenerationRequest g;
  g.prompts = j.at("prompts").get<std::vector<std::vector<int64_t>>>();
  g.tokens_to_generate = j.at("tokens_to_generate").get<int64_t>();
  g.sampling = inference::SamplingParams{j.at("temperature").get<float>(),
                                         j.at("top_k").get<int64_t>(), j.at("top_p").get<float>()};
  g.return_log_probs = j.at("return_log_probs").get<bool>();
  g.seed = j.at("seed").get<uint64_t>();
  for (const nlohmann::json& st : j.at("streams")) {
    g.streams.push_back({st.at(0).get<uint64_t>(), st.at(1).get<uint64_t>()});
  }
  g.stop_on_eod = j.at("stop_on_eod").get<bool>();
  g.top_n_logprobs = j.at("top_n_logprobs").get<int64_t>();
  g.top_p_decay = j.at("top_p_decay").get<float>();
  g.top_p_bound = j.at("top_p_bound").get<float>();
  g.stop_on_eol = j.at("stop_on_eol").get<bool>();
  g.stop_on_double_eol = j.at("stop_on_double_eol").get<bool>();
  g.prevent_newline_after_colon = j.at("prevent_newline_after_colon").get<bool>();
  g.colon_id = j.at("colon_id").get<int64_t>();
  g.newline_id = j.at("newline_id").get<int64_t>();
  return g;
}

}  // namespace megatron::serve
