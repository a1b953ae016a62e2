// libFuzzer harness for the bodies `tandem serve` reads from the network: the real HttpServer (src/serve/,
// compiled with the sanitizers) runs in this process over a Scheduler on the shipped draft model, on a free
// loopback port; each input is one request sent with cpp-httplib's client over real HTTP. The first byte
// picks the route (/v1/completions, /v1/chat/completions, /tokenize, /detokenize), the rest is the body.
//
// Findings beyond a crash or a sanitizer report:
//   - no answer at all (the server died or hung), or a 5xx other than 503 (overloaded): a 500 means an
//     exception other than tandem::Error reached cpp-httplib;
//   - an answer whose body is not JSON, or a 4xx without an OpenAI-shaped {"error": {"message": ...}};
//   - an error message that is a JSON library exception ("[json.exception...") other than the parser's
//     position in a body that is not JSON: the server must name the field, not leak the library's text;
//   - for a stream, an answer that does not end with "data: [DONE]" (a stream cut short).
// The server keeps running across inputs (a request must not break the next one).
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/error.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace {

[[noreturn]] void finding(const std::string& what, const std::string& route, const std::string& body,
                          const std::string& answer) {
  std::fprintf(stderr, "FINDING: %s\nroute: %s\nrequest body: %s\nanswer: %s\n", what.c_str(), route.c_str(),
               body.c_str(), answer.c_str());
  std::abort();
}

struct Server {
  std::unique_ptr<tandem::serve::Scheduler> sched;
  std::unique_ptr<tandem::serve::HttpServer> http;
  std::thread thread;
  int port = 0;

  Server() {
    tandem::ModelParams mp;
    mp.n_threads = 1;
    auto model = tandem::Model::load(std::string(TANDEM_SOURCE_DIR) + "/models/tandem-draft-q8_0.gguf", mp);
    tandem::serve::SchedulerParams sp;
    sp.n_slots = 2;
    sp.n_ctx = 128;  // 64 positions a slot: a request that asks for more tokens is cut short, fast
    sp.n_batch = 64;
    sp.queue_timeout_s = 10.0;
    sched = std::make_unique<tandem::serve::Scheduler>(model, tandem::SessionParams{}, sp);
    tandem::serve::HttpParams hp;
    hp.port = 0;
    hp.max_body = 1 << 16;
    hp.chat_template = "chatml";  // the draft model's GGUF may have none: chat completions need one
    http = std::make_unique<tandem::serve::HttpServer>(*sched, hp);
    port = http->bind();
    thread = std::thread([this] { http->serve(); });
  }
};

Server& server() {
  static Server* s = new Server();  // never destroyed: the server serves until the process ends
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const routes[] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
  const std::string route = routes[data[0] % 4];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  httplib::Client client("127.0.0.1", server().port);
  client.set_read_timeout(60, 0);
  const httplib::Result r = client.Post(route, body, "application/json");
  if (!r) finding("no answer (" + httplib::to_string(r.error()) + ")", route, body, "");
  const int status = r->status;
  const std::string& answer = r->body;
  if (status >= 500 && status != 503) finding("HTTP " + std::to_string(status), route, body, answer);
  const bool stream = r->get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
  if (stream) {
    if (status != 200 || answer.size() < 14 ||
        answer.compare(answer.size() - 14, 14, "data: [DONE]\n\n") != 0)
      finding("a stream that does not end with data: [DONE]", route, body, answer);
    return 0;
  }
  const nlohmann::json j = nlohmann::json::parse(answer, nullptr, false);
  if (j.is_discarded()) finding("an answer that is not JSON", route, body, answer);
  if (status >= 400) {
    if (!j.is_object() || !j.contains("error") || !j["error"].is_object() ||
        !j["error"].contains("message") || !j["error"]["message"].is_string())
      finding("an error answer without error.message", route, body, answer);
    // The parser's own text is fine where it says where the body is not JSON ("... not valid JSON: [json.
    // exception.parse_error.101] parse error at line 1, column 130: ..."); any other library exception in a
    // message means a request got past the checks that name the field.
    const std::string message = j["error"]["message"].get<std::string>();
    if (message.find("[json.exception") != std::string::npos &&
        message.find("not valid JSON: [json.exception.parse_error") == std::string::npos)
      finding("a JSON library exception as the error message", route, body, answer);
  } else if (status != 200) {
    finding("HTTP " + std::to_string(status), route, body, answer);
  }
  return 0;
}
