// The OpenAI-compatible HTTP front of `tandem serve` (cpp-httplib + nlohmann-json) over a Scheduler.
//
// Routes: POST /v1/completions, POST /v1/chat/completions (the model's template or --chat-template), GET
// /v1/models, GET /health, POST /tokenize, POST /detokenize, GET /metrics. Errors are OpenAI-shaped:
// {"error": {"message", "type", "code"}} with 400 (bad request), 401 (--api-key), 404 (unknown route or
// model), 413 (body over --max-body), 503 (no room within the queue timeout).
//
// Streaming ("stream": true) answers with server-sent events, one `data: {chunk}` per token and `data:
// [DONE]`; a failed write (the client went away) cancels the request, which frees its KV cells at the next
// step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "serve/scheduler.h"

namespace tandem::serve {

struct HttpParams {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed)
  std::string api_key;
  std::string model_id;       // the name /v1/models reports and requests may give; empty = the file's stem
  std::string chat_template;  // override name or path for chat completions (empty: the model's)
  size_t max_body = 1 << 20;
  int n_http_threads = 0;  // 0: 2 * n_slots + 16
};

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, HttpParams params);
  ~HttpServer();
  // Binds; returns the port (the free one chosen for port 0). Throws Error when the address cannot be bound.
  int bind();
  // Serves until stop() (blocks).
  void serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::serve
