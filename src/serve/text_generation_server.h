// TextGenerationServer: the HTTP side of `megatron serve` (Megatron's MegatronServer): PUT /api,
// POST /completions and GET /health over cpp-httplib, in front of one generation worker.
//
// HTTP threads parse and check each request (text_request.h) and queue it; the thread that calls
// serve() is the worker: it takes the queued requests, runs them through the caller's Runner (on
// that thread, since the model's collectives are MPI calls of the main thread) and hands each its
// response. Requests that ask for the same generation settings (everything but the prompts and the
// seed) are batched into one Runner call (--no-request-batching: one at a time, as Megatron's
// global lock serves them); a request keeps the sampling draws it would have had alone.
//
// Bounds: at most max_queued requests wait (more: 503, retry later); a request not answered within
// timeout_s gets 504 (a queued one is dropped, a running one finishes unseen); bodies above
// max_body_bytes get 413 from the library; malformed JSON and bad fields 400 with the reason.
// The server never stops for a bad request. stop() (e.g. on SIGTERM) drains: new requests get 503,
// queued and running ones are answered, then serve() returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/text_request.h"

namespace megatron::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 5000;          // 0: any free port (port() says which)
  int64_t max_queued = 64;  // requests waiting beyond the running ones
  double timeout_s = 600;   // per request, from arrival to answer
  size_t max_body_bytes = 1 << 20;
  bool batching = true;
};

struct Response {
  int status = 200;
  std::string body;  // JSON
};

// Runs requests on the worker thread: one response per request, in order. May throw; the
// requests are then answered 500 with the reason.
using Runner = std::function<std::vector<Response>(const std::vector<TextRequest>&)>;

class TextGenerationServer {
 public:
  TextGenerationServer(ServerOptions options, Runner runner);
  ~TextGenerationServer();
  TextGenerationServer(const TextGenerationServer&) = delete;
  TextGenerationServer& operator=(const TextGenerationServer&) = delete;

  // Binds host:port; InvalidArgument naming --host/--port if that fails.
  void bind();
  int port() const { return port_; }
  // Serves until stop(), then drains and returns. Polls `poll` (e.g. a signal flag) every 50 ms:
  // true stops the server as stop() does.
  void serve(const std::function<bool()>& poll = {});
  void stop();

  // Requests answered so far and requests batched with others (for the log and tests).
  int64_t answered() const { return answered_; }
  int64_t batched() const { return batched_; }

 private:
  struct Job;
  Response submit(TextRequest request);
  void work(std::vector<std::shared_ptr<Job>> jobs);
  std::vector<std::shared_ptr<Job>> take_jobs();  // under mutex_

  struct Http;
  std::unique_ptr<Http> http_;
  ServerOptions options_;
  Runner runner_;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> answered_{0}, batched_{0};
};

// The key under which requests batch: their generation settings without prompts and seeds.
std::string batch_key(const TextRequest& r);

}  // namespace megatron::serve
