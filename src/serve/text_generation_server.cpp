// The HTTP endpoints, the bounded queue and the worker loop (text_generation_server.h).
#include "serve/text_generation_server.h"

#include <chrono>
#include <future>
#include <thread>

#include <httplib.h>

#include "core/error.h"
#include "core/logging.h"

namespace megatron::serve {

struct TextGenerationServer::Job {
  TextRequest request;
  std::promise<Response> answer;
  std::atomic<bool> abandoned{false};  // the client's wait timed out while it was queued
};

struct TextGenerationServer::Http {
  httplib::Server server;
  std::thread listener;
};

namespace {
Response json_response(int status, const std::string& message) {
  return Response{status, error_body(message)};
}
}  // namespace

std::string batch_key(const TextRequest& r) {
  const inference::GenerationRequest& g = r.generation;
  nlohmann::json k = {static_cast<int>(r.endpoint),
                      g.tokens_to_generate,
                      g.return_log_probs,
                      g.sampling.temperature,
                      g.sampling.top_k,
                      g.sampling.top_p,
                      g.top_p_decay,
                      g.top_p_bound,
                      g.stop_on_eol,
                      g.stop_on_double_eol,
                      g.prevent_newline_after_colon,
                      g.top_n_logprobs};
  return k.dump();
}

TextGenerationServer::TextGenerationServer(ServerOptions options, Runner runner)
    : http_(std::make_unique<Http>()), options_(std::move(options)), runner_(std::move(runner)) {
  httplib::Server& s = http_->server;
  // One HTTP thread per request that may be waiting or running, and a few for the refusals.
  const auto threads = static_cast<size_t>(options_.max_queued) + 4;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_read_timeout(30);
  s.set_write_timeout(30);
  auto handle = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) {
      Response out;
      try {
        nlohmann::json body;
        try {
          body = nlohmann::json::parse(req.body);
        } catch (const nlohmann::json::exception& e) {
          throw RequestError(400, std::string("the request body is not valid JSON: ") + e.what());
        }
        TextRequest request =
            endpoint == Endpoint::kApi ? parse_api_request(body) : parse_completions_request(body);
        if (!request.no_log) {  // Megatron's request log, as one block
          log_line("request IP: " + req.remote_addr + "\n" +
                   body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                   "\nstart time: " + timestamp());
        }
        out = submit(std::move(request));
      } catch (const RequestError& e) {
        out = json_response(e.status(), e.what());
      } catch (const std::exception& e) {
        out = json_response(500, std::string("internal error: ") + e.what());
      }
      res.status = out.status;
      res.set_content(out.body, "application/json");
    };
  };
  s.Put("/api", handle(Endpoint::kApi));
  s.Post("/completions", handle(Endpoint::kCompletions));
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    int64_t queued = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued = static_cast<int64_t>(queue_.size());
    }
    res.status = stopping_ ? 503 : 200;
    res.set_content(nlohmann::json{{"status", stopping_ ? "draining" : "ok"},
                                   {"queued", queued},
                                   {"answered", answered_.load()},
                                   {"batched", batched_.load()}}
                        .dump(),
                    "application/json");
  });
  // Unknown paths and methods: the library's 404/405 with a JSON reason.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string why = res.status == 413
                          ? "the request body exceeds the server's limit (--max-request-bytes)"
                          : "no such endpoint: " + req.method + " " + req.path +
                                " (PUT /api, POST /completions, GET /health)";
    res.set_content(error_body(why), "application/json");
  });
}

TextGenerationServer::~TextGenerationServer() {
  if (http_->listener.joinable()) {
    http_->server.stop();
    http_->listener.join();
  }
}

void TextGenerationServer::bind() {
  httplib::Server& s = http_->server;
  if (options_.port == 0) {
    port_ = s.bind_to_any_port(options_.host);
    MEGATRON_CHECK(port_ > 0, "--host ", options_.host, ": cannot bind a port there");
  } else {
    MEGATRON_CHECK(s.bind_to_port(options_.host, options_.port), "--host ", options_.host,
                   " --port ", options_.port,
                   ": cannot bind (the port is in use or the address is not this machine's); "
                   "pick another --port");
    port_ = options_.port;
  }
}

Response TextGenerationServer::submit(TextRequest request) {
  auto job = std::make_shared<Job>();
  job->request = std::move(request);
  std::future<Response> answer = job->answer.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return json_response(503, "the server is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queued) {
      return json_response(503, "the server is busy: " + std::to_string(queue_.size()) +
                                    " requests are waiting (--max-queued-requests); retry later");
    }
    queue_.push_back(job);
  }
  wake_.notify_one();
  const auto limit = std::chrono::duration<double>(options_.timeout_s);
  if (answer.wait_for(limit) == std::future_status::ready) return answer.get();
  job->abandoned = true;
  return json_response(504, "the request was not answered within " +
                                std::to_string(static_cast<int64_t>(options_.timeout_s)) +
                                " s (--request-timeout)");
}

std::vector<std::shared_ptr<TextGenerationServer::Job>> TextGenerationServer::take_jobs() {
  std::vector<std::shared_ptr<Job>> jobs;
  while (!queue_.empty() && queue_.front()->abandoned) queue_.pop_front();
  if (queue_.empty()) return jobs;
  jobs.push_back(queue_.front());
  queue_.pop_front();
  if (!options_.batching) return jobs;
  const std::string key = batch_key(jobs.front()->request);
  size_t prompts = jobs.front()->request.prompts.size() + jobs.front()->request.prompt_ids.size();
  for (auto it = queue_.begin(); it != queue_.end();) {
    const TextRequest& r = (*it)->request;
    const size_t n = r.prompts.size() + r.prompt_ids.size();
    if (!(*it)->abandoned && batch_key(r) == key && prompts + n <= kMaxPrompts) {
      prompts += n;
      jobs.push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return jobs;
}

void TextGenerationServer::work(std::vector<std::shared_ptr<Job>> jobs) {
  std::vector<TextRequest> requests;
  for (const auto& j : jobs) requests.push_back(j->request);
  std::vector<Response> out;
  try {
    out = runner_(requests);
    MEGATRON_ASSERT(out.size() == jobs.size(), "the runner answered ", out.size(), " of ",
                    jobs.size(), " requests");
  } catch (const std::exception& e) {
    out.assign(jobs.size(), json_response(500, std::string("internal error: ") + e.what()));
  }
  if (jobs.size() > 1) batched_ += static_cast<int64_t>(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i]->answer.set_value(std::move(out[i]));
  answered_ += static_cast<int64_t>(jobs.size());
}

void TextGenerationServer::serve(const std::function<bool()>& poll) {
  if (port_ == 0) bind();
  http_->listener = std::thread([this] { http_->server.listen_after_bind(); });
  for (;;) {
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return !queue_.empty() || stopping_; });
      if (!stopping_ && poll && poll()) stopping_ = true;
      jobs = take_jobs();
      if (jobs.empty() && stopping_) break;  // drained
    }
    if (!jobs.empty()) work(std::move(jobs));
  }
  // Every queued request is answered; the HTTP threads finish writing theirs, then stop.
  http_->server.stop();
  http_->listener.join();
}

void TextGenerationServer::stop() {
  stopping_ = true;
  wake_.notify_all();
}

}  // namespace megatron::serve
