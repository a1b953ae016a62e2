// OpenAI-compatible routes over the Scheduler (src/serve/http_server.h).
#include "serve/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "serve/client_socket.h"
#include "tandem/chat.h"
#include "tandem/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::serve {

using json = nlohmann::json;

namespace {

// The client of a waiting request went away: nothing is answered (the connection is gone).
struct ClientGone {};

// A request the server answers with an OpenAI-shaped error.
struct ApiError {
  int status;
  std::string type;  // "invalid_request_error", "authentication_error", "not_found_error", ...
  std::string code;
  std::string message;
};

[[noreturn]] void bad_request(const std::string& message, const std::string& code = "invalid_value") {
  throw ApiError{400, "invalid_request_error", code, message};
}

// JSON text of an answer. Token text may end inside a UTF-8 character (a byte-level token, a piece cut at
// max_tokens): such bytes become U+FFFD instead of the JSON library throwing (a 400 for a good request, or a
// stream cut short without [DONE]; found by fuzz/fuzz_serve_request). OpenAI's answers do the same; the
// logprobs' "bytes" fields keep the exact bytes.
std::string to_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json error_body(const std::string& message, const std::string& type, const std::string& code) {
  return json{{"error", {{"message", message}, {"type", type}, {"code", code}}}};
}

void set_error(httplib::Response& res, int status, const std::string& type, const std::string& code,
               const std::string& message) {
  res.status = status;
  res.set_content(to_text(error_body(message, type, code)), "application/json");
}

// Typed field access with a clear message naming the field.
bool has(const json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

int64_t get_int(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!has(body, key)) return def;
  const json& v = body[key];
  if (!v.is_number_integer()) bad_request(std::string("'") + key + "' must be an integer", "invalid_type");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad_request(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got " + std::to_string(x));
  return x;
}

double get_num(const json& body, const char* key, double def, double lo, double hi) {
  if (!has(body, key)) return def;
  const json& v = body[key];
  if (!v.is_number()) bad_request(std::string("'") + key + "' must be a number", "invalid_type");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_request(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got " + v.dump());
  return x;
}

bool get_bool(const json& body, const char* key, bool def) {
  if (!has(body, key)) return def;
  if (!body[key].is_boolean()) bad_request(std::string("'") + key + "' must be a boolean", "invalid_type");
  return body[key].get<bool>();
}

json parse_body(const httplib::Request& req) {
  try {
    json body = json::parse(req.body);
    if (!body.is_object()) bad_request("the request body must be a JSON object", "invalid_json");
    return body;
  } catch (const json::parse_error& e) {
    bad_request(std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* finish_name(FinishReason r) {
  return r == FinishReason::Length ? "length" : "stop";
}

}  // namespace

struct HttpServer::Impl {
  Scheduler& sched;
  HttpParams params;
  httplib::Server server;
  const tokenizer::Tokenizer* tok = nullptr;
  std::atomic<uint64_t> next_id{1};
  int listen_fd = -1;  // the listening socket, seen when httplib creates it
  std::unique_ptr<ChatTemplate> chat;
  std::string chat_error;

  Impl(Scheduler& s, HttpParams p) : sched(s), params(std::move(p)) {
    if (params.model_id.empty())
      params.model_id = std::filesystem::path(sched.model().info().path).stem().string();
    if (sched.model().has_tokenizer()) tok = &sched.model().tokenizer();
    try {
      chat = std::make_unique<ChatTemplate>(ChatTemplate::from_model(sched.model(), params.chat_template));
    } catch (const Error& e) {
      // A template asked for by name must work: the server refuses to start. A model without a usable
      // template of its own still serves plain completions; chat completions answer with this message.
      if (!params.chat_template.empty()) throw;
      chat_error = e.what();
    }
  }

  const tokenizer::Tokenizer& tokenizer() const {
    if (!tok)
      throw ApiError{400, "invalid_request_error", "no_tokenizer", "this model has no usable tokenizer"};
    return *tok;
  }

  void check_model(const json& body) const {
    if (!has(body, "model")) return;
    if (!body["model"].is_string()) bad_request("'model' must be a string", "invalid_type");
    const std::string m = body["model"].get<std::string>();
    if (m != params.model_id)
      throw ApiError{404, "invalid_request_error", "model_not_found",
                     "the model '" + m + "' does not exist; this server serves '" + params.model_id + "'"};
  }

  // The prompt of /v1/completions: text, one text in a list, or token ids.
  std::vector<int32_t> completion_prompt(const json& body) const {
    if (!has(body, "prompt")) bad_request("'prompt' is required", "missing_field");
    json p = body["prompt"];
    if (p.is_array() && p.size() == 1 && p[0].is_string()) p = p[0];
    if (p.is_array() && p.size() == 1 && p[0].is_array()) p = p[0];
    if (p.is_string()) {
      std::vector<int32_t> ids = tokenizer().encode(p.get<std::string>(), true, true);
      if (ids.empty()) bad_request("the prompt is empty after tokenization");
      return ids;
    }
    if (p.is_array()) {
      if (p.empty()) bad_request("'prompt' is empty");
      std::vector<int32_t> ids;
      for (const json& t : p) {
        if (!t.is_number_integer())
          bad_request(
              "'prompt' must be a string or a list of token ids (integers); several prompts in one "
              "request are not supported",
              "invalid_type");
        const int64_t v = t.get<int64_t>();
        if (v < 0 || v >= sched.model().info().n_vocab)
          bad_request("token id " + std::to_string(v) + " in 'prompt' is outside the vocabulary [0, " +
                      std::to_string(sched.model().info().n_vocab) + ")");
        ids.push_back(int32_t(v));
      }
      return ids;
    }
    bad_request("'prompt' must be a string or a list of token ids", "invalid_type");
  }

  // Sampling and limits shared by both completion routes.
  GenerationParams generation(const json& body, int64_t default_max) const {
    GenerationParams g;
    const int64_t cap = sched.slot_capacity();
    int64_t max_tokens = default_max;
    if (has(body, "max_completion_tokens"))
      max_tokens = get_int(body, "max_completion_tokens", 0, 0, INT32_MAX);
    max_tokens = get_int(body, "max_tokens", max_tokens, 0, INT32_MAX);
    g.max_tokens = int32_t(std::min<int64_t>(max_tokens, cap));
    SamplingParams& s = g.sampling;
    s.temperature = float(get_num(body, "temperature", 1.0, 0.0, 100.0));
    s.top_p = float(get_num(body, "top_p", 1.0, 0.0, 1.0));
    s.top_k = int32_t(get_int(body, "top_k", 0, 0, INT32_MAX));
    s.min_p = float(get_num(body, "min_p", 0.0, 0.0, 1.0));
    s.presence_penalty = float(get_num(body, "presence_penalty", 0.0, -2.0, 2.0));
    s.frequency_penalty = float(get_num(body, "frequency_penalty", 0.0, -2.0, 2.0));
    s.repeat_penalty = float(get_num(body, "repeat_penalty", 1.0, 1e-6, 100.0));
    s.penalty_last_n = -1;
    if (has(body, "seed")) {
      s.seed = uint64_t(get_int(body, "seed", 0, 0, std::numeric_limits<int64_t>::max()));
    } else {
      std::random_device rd;
      s.seed = (uint64_t(rd()) << 32) ^ rd();
    }
    if (has(body, "stop")) {
      const json& st = body["stop"];
      if (st.is_string()) {
        g.stop.push_back(st.get<std::string>());
      } else if (st.is_array()) {
        for (const json& x : st) {
          if (!x.is_string()) bad_request("'stop' must be a string or a list of strings", "invalid_type");
          g.stop.push_back(x.get<std::string>());
        }
      } else {
        bad_request("'stop' must be a string or a list of strings", "invalid_type");
      }
      for (const std::string& x : g.stop)
        if (x.empty()) bad_request("'stop' holds an empty string");
      if (!g.stop.empty()) tokenizer();
    }
    g.ignore_eos = get_bool(body, "ignore_eos", false);
    return g;
  }

  // One running completion: its n choices share one channel.
  struct Job {
    std::shared_ptr<Channel> channel = std::make_shared<Channel>();
    int n = 1;
    int n_prompt = 0;
    int client_fd = -1;  // the request's socket (client_socket.h); -1: not found
    // Cancels the job when its client has closed the connection; true then.
    bool client_left() const {
      if (!client_gone(client_fd)) return false;
      channel->cancel();  // its cells are freed at the next step
      return true;
    }
  };

  Job submit(const std::vector<int32_t>& prompt, const GenerationParams& g, int n, int n_logprobs) {
    Job job;
    job.n = n;
    job.n_prompt = int(prompt.size());
    for (int i = 0; i < n; ++i) {
      ServeRequest r;
      r.prompt = prompt;
      r.gen = g;
      r.gen.sampling.seed = g.sampling.seed + uint64_t(i);
      r.n_logprobs = n_logprobs;
      r.index = i;
      r.channel = job.channel;
      try {
        sched.submit(std::move(r));
      } catch (const Error& e) {
        job.channel->cancel();
        bad_request(e.what());
      }
    }
    return job;
  }

  std::string token_piece(int32_t id) const { return tok ? tok->token_to_piece(id) : std::to_string(id); }

  static json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  }

  // Logprobs of one token event, in the completions shape (parallel lists) or the chat shape (entries).
  json chat_logprob(const RequestEvent& e) const {
    json top = json::array();
    for (const TopLogprob& t : e.top) {
      const std::string p = token_piece(t.token);
      top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
    }
    const std::string p = token_piece(e.token);
    return {{"token", p}, {"logprob", e.logprob}, {"bytes", bytes_of(p)}, {"top_logprobs", top}};
  }

  struct Choice {
    std::string text;
    FinishReason finish = FinishReason::None;
    int n_generated = 0;
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         chat_content = json::array();
  };

  void record(Choice& c, const RequestEvent& e, int n_logprobs) const {
    c.text += e.text;
    if (e.token >= 0 && n_logprobs >= 0) {
      c.tokens.push_back(token_piece(e.token));
      c.token_logprobs.push_back(e.logprob);
      json top = json::object();
      for (const TopLogprob& t : e.top) top[token_piece(t.token)] = t.logprob;
      c.top_logprobs.push_back(top);
      c.chat_content.push_back(chat_logprob(e));
    }
    if (e.token < 0) {
      c.finish = e.finish;
      c.n_generated = e.n_generated;
    }
  }

  // Waits for the first event of a job: a rejection (queue timeout, shutdown) becomes a 503 before any byte
  // of the answer is sent. A client that leaves meanwhile (queued or prefilling) cancels it.
  std::vector<RequestEvent> first_events(Job& job) {
    while (true) {
      std::vector<RequestEvent> ev = job.channel->pop(std::chrono::milliseconds(100));
      for (const RequestEvent& e : ev)
        if (e.rejected) {
          job.channel->cancel();
          throw ApiError{503, "server_error", "overloaded", e.error};
        }
      if (!ev.empty()) return ev;
      if (job.client_left()) throw ClientGone{};
    }
  }

  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = parse_body(req);
    check_model(body);
    std::vector<int32_t> prompt;
    if (chat) {
      prompt = chat_prompt(body);
    } else {
      prompt = completion_prompt(body);
    }
    const GenerationParams g = generation(body, chat ? sched.slot_capacity() : 16);
    const int n = int(get_int(body, "n", 1, 1, 16));
    const bool stream = get_bool(body, "stream", false);
    int n_logprobs = -1;
    if (chat) {
      if (get_bool(body, "logprobs", false))
        n_logprobs = int(get_int(body, "top_logprobs", 0, 0, 20));
      else if (has(body, "top_logprobs"))
        bad_request("'top_logprobs' needs 'logprobs': true");
    } else if (has(body, "logprobs")) {
      n_logprobs = int(get_int(body, "logprobs", 0, 0, 20));
    }
    bool include_usage = false;
    if (has(body, "stream_options")) {
      if (!body["stream_options"].is_object())
        bad_request("'stream_options' must be an object", "invalid_type");
      include_usage = get_bool(body["stream_options"], "include_usage", false);
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    const int64_t created = int64_t(unix_now());
    Job job = submit(prompt, g, n, n_logprobs);
    job.client_fd = find_client_socket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    std::vector<RequestEvent> first = first_events(job);

    if (!stream) {
      std::vector<Choice> choices(static_cast<size_t>(n));
      int finished = 0;
      std::vector<RequestEvent> ev = std::move(first);
      while (true) {
        for (const RequestEvent& e : ev) {
          if (e.rejected) throw ApiError{503, "server_error", "overloaded", e.error};
          record(choices[size_t(e.index)], e, n_logprobs);
          if (e.token < 0) ++finished;
        }
        if (finished == n) break;
        ev = job.channel->pop(std::chrono::milliseconds(100));
        // Nothing is written before the end: the socket tells whether the client is still there.
        if (job.client_left()) throw ClientGone{};
      }
      json out_choices = json::array();
      int completion_tokens = 0;
      for (int i = 0; i < n; ++i) {
        const Choice& c = choices[size_t(i)];
        completion_tokens += c.n_generated;
        json ch{{"index", i}, {"finish_reason", finish_name(c.finish)}};
        if (chat) {
          ch["message"] = {{"role", "assistant"}, {"content", c.text}};
          ch["logprobs"] = n_logprobs >= 0 ? json{{"content", c.chat_content}} : json(nullptr);
        } else {
          ch["text"] = c.text;
          ch["logprobs"] = n_logprobs >= 0 ? json{{"tokens", c.tokens},
                                                  {"token_logprobs", c.token_logprobs},
                                                  {"top_logprobs", c.top_logprobs}}
                                           : json(nullptr);
        }
        out_choices.push_back(ch);
      }
      const json out{{"id", id},
                     {"object", chat ? "chat.completion" : "text_completion"},
                     {"created", created},
                     {"model", params.model_id},
                     {"choices", out_choices},
                     {"usage",
                      {{"prompt_tokens", job.n_prompt},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", job.n_prompt + completion_tokens}}}};
      res.set_content(to_text(out), "application/json");
      return;
    }

    // Server-sent events; the provider writes the whole stream, and a failed write cancels the job.
    auto channel = job.channel;
    auto pending = std::make_shared<std::vector<RequestEvent>>(std::move(first));
    const int n_prompt = job.n_prompt;
    const int client_fd = job.client_fd;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, channel, pending, n, chat, n_logprobs, include_usage, id, created, n_prompt, client_fd](
            size_t, httplib::DataSink& sink) {
          auto send = [&](const json& chunk) {
            const std::string s = "data: " + to_text(chunk) + "\n\n";
            if (!sink.write(s.data(), s.size())) throw std::runtime_error("client gone");
          };
          auto chunk_of = [&](json choices) {
            return json{{"id", id},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", params.model_id},
                        {"choices", std::move(choices)}};
          };
          try {
            if (chat)
              for (int i = 0; i < n; ++i)
                send(chunk_of(json::array({{{"index", i},
                                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}})));
            int finished = 0, completion_tokens = 0;
            std::vector<RequestEvent> ev = std::move(*pending);
            while (finished < n) {
              for (const RequestEvent& e : ev) {
                if (e.rejected) {
                  send(error_body(e.error, "server_error", "overloaded"));
                  finished = n;
                  break;
                }
                const bool last = e.token < 0;
                if (!last && e.text.empty() && n_logprobs < 0) continue;
                json c{{"index", e.index},
                       {"finish_reason", last ? json(finish_name(e.finish)) : json(nullptr)}};
                json lp = nullptr;
                if (n_logprobs >= 0 && !last) {
                  if (chat) {
                    lp = {{"content", json::array({chat_logprob(e)})}};
                  } else {
                    json top = json::object();
                    for (const TopLogprob& t : e.top) top[token_piece(t.token)] = t.logprob;
                    lp = {{"tokens", {token_piece(e.token)}},
                          {"token_logprobs", {e.logprob}},
                          {"top_logprobs", json::array({top})}};
                  }
                }
                c["logprobs"] = lp;
                if (chat)
                  c["delta"] = e.text.empty() && last ? json::object() : json{{"content", e.text}};
                else
                  c["text"] = e.text;
                send(chunk_of(json::array({c})));
                if (last) {
                  ++finished;
                  completion_tokens += e.n_generated;
                }
              }
              if (finished < n) {
                ev = channel->pop(std::chrono::milliseconds(100));
                if (ev.empty() && (!sink.is_writable() || client_gone(client_fd)))
                  throw std::runtime_error("client gone");
              }
            }
            if (include_usage) {
              json u = chunk_of(json::array());
              u["usage"] = {{"prompt_tokens", n_prompt},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", n_prompt + completion_tokens}};
              send(u);
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          } catch (const std::exception&) {
            channel->cancel();  // the client went away: its cells are freed at the next step
            return false;
          }
        },
        [channel](bool success) {
          if (!success) channel->cancel();
        });
  }

  std::vector<int32_t> chat_prompt(const json& body) {
    if (!chat) throw ApiError{400, "invalid_request_error", "no_chat_template", chat_error};
    if (!has(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
      bad_request("'messages' must be a non-empty list of messages", "invalid_type");
    std::vector<ChatMessage> messages;
    for (const json& m : body["messages"]) {
      if (!m.is_object() || !has(m, "role") || !m["role"].is_string())
        bad_request("each message must be an object with a string 'role'", "invalid_type");
      ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      if (has(m, "content")) {
        const json& c = m["content"];
        if (c.is_string()) {
          cm.content = c.get<std::string>();
        } else if (c.is_array()) {  // content parts: the text parts, concatenated
          for (const json& part : c) {
            if (!part.is_object() || !has(part, "text") || !part["text"].is_string())
              bad_request("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                          "invalid_type");
            cm.content += part["text"].get<std::string>();
          }
        } else {
          bad_request("a message's 'content' must be a string or a list of text parts", "invalid_type");
        }
      }
      messages.push_back(std::move(cm));
    }
    std::string text;
    try {
      if (has(body, "chat_template_kwargs")) {
        if (!body["chat_template_kwargs"].is_object())
          bad_request("'chat_template_kwargs' must be an object", "invalid_type");
        text = chat->render(messages, true, body["chat_template_kwargs"].dump());
      } else {
        text = chat->render(messages, true);
      }
    } catch (const Error& e) {
      bad_request(std::string("the chat template failed: ") + e.what());
    }
    // A template that writes the BOS token itself gets no second one.
    const tokenizer::Tokenizer& t = tokenizer();
    const bool has_bos = !chat->bos_token().empty() && text.rfind(chat->bos_token(), 0) == 0;
    std::vector<int32_t> ids = t.encode(text, !has_bos, true);
    if (ids.empty()) bad_request("the conversation is empty after tokenization");
    return ids;
  }

  // Runs a route, turning errors into OpenAI-shaped bodies.
  template <typename F>
  httplib::Server::Handler route(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      sched.metrics().on_http_request();
      try {
        f(req, res);
      } catch (const ClientGone&) {
        // Nobody reads the answer; the connection is closed after this.
        res.status = 499;
        res.set_header("Connection", "close");
      } catch (const ApiError& e) {
        set_error(res, e.status, e.type, e.code, e.message);
      } catch (const Error& e) {
        set_error(res, 400, "invalid_request_error", "invalid_value", e.what());
      } catch (const json::exception& e) {
        set_error(res, 400, "invalid_request_error", "invalid_type", e.what());
      }
    };
  }

  void setup() {
    const int threads = params.n_http_threads > 0 ? params.n_http_threads : 2 * sched.params().n_slots + 16;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
    server.set_payload_max_length(params.max_body);
    server.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd = int(sock);
    });
    server.set_keep_alive_max_count(1000);
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (params.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + params.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      set_error(res, 401, "authentication_error", "invalid_api_key",
                "missing or wrong API key: send 'Authorization: Bearer <key>' (--api-key)");
      return httplib::Server::HandlerResponse::Handled;
    });
    server.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                         httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (res.status == 413)
        set_error(res, 413, "invalid_request_error", "payload_too_large",
                  "the request body exceeds " + std::to_string(params.max_body) + " bytes (--max-body)");
      else if (res.status == 404)
        set_error(res, 404, "invalid_request_error", "not_found", "no route " + req.method + " " + req.path);
      else
        set_error(res, res.status, "invalid_request_error", "bad_request",
                  "the request could not be handled (HTTP " + std::to_string(res.status) + ")");
      return httplib::Server::HandlerResponse::Handled;
    }));
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      set_error(res, 500, "server_error", "internal_error", what);
    });

    server.Get("/health", route([](const httplib::Request&, httplib::Response& res) {
                 res.set_content(R"({"status":"ok"})", "application/json");
               }));
    server.Get("/v1/models", route([this](const httplib::Request&, httplib::Response& res) {
                 const json out{{"object", "list"},
                                {"data",
                                 {{{"id", params.model_id},
                                   {"object", "model"},
                                   {"created", int64_t(unix_now())},
                                   {"owned_by", "tandem"}}}}};
                 res.set_content(to_text(out), "application/json");
               }));
    server.Get("/metrics", route([this](const httplib::Request&, httplib::Response& res) {
                 res.set_content(sched.metrics().render(), "text/plain; version=0.0.4");
               }));
    server.Post("/tokenize", route([this](const httplib::Request& req, httplib::Response& res) {
                  const json body = parse_body(req);
                  if (!has(body, "content") || !body["content"].is_string())
                    bad_request("'content' (a string) is required", "invalid_type");
                  const bool add_special = get_bool(body, "add_special", true);
                  const std::vector<int32_t> ids =
                      tokenizer().encode(body["content"].get<std::string>(), add_special, true);
                  res.set_content(to_text(json{{"tokens", ids}}), "application/json");
                }));
    server.Post("/detokenize", route([this](const httplib::Request& req, httplib::Response& res) {
                  const json body = parse_body(req);
                  if (!has(body, "tokens") || !body["tokens"].is_array())
                    bad_request("'tokens' (a list of token ids) is required", "invalid_type");
                  std::vector<int32_t> ids;
                  for (const json& t : body["tokens"]) {
                    if (!t.is_number_integer()) bad_request("'tokens' must hold integers", "invalid_type");
                    const int64_t v = t.get<int64_t>();
                    if (v < 0 || v >= tokenizer().n_vocab())
                      bad_request("token id " + std::to_string(v) + " is outside the vocabulary");
                    ids.push_back(int32_t(v));
                  }
                  res.set_content(to_text(json{{"content", tokenizer().decode(ids)}}), "application/json");
                }));
    server.Post("/v1/completions", route([this](const httplib::Request& req, httplib::Response& res) {
                  handle_completion(req, res, false);
                }));
    server.Post("/v1/chat/completions", route([this](const httplib::Request& req, httplib::Response& res) {
                  handle_completion(req, res, true);
                }));
  }
};

HttpServer::HttpServer(Scheduler& scheduler, HttpParams params)
    : impl_(std::make_unique<Impl>(scheduler, std::move(params))) {
  impl_->setup();
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind() {
  const HttpParams& p = impl_->params;
  int port = p.port;
  if (port == 0) {
    port = impl_->server.bind_to_any_port(p.host);
    check(port > 0, "cannot listen on " + p.host + " (--host)");
  } else {
    check(impl_->server.bind_to_port(p.host, port), "cannot listen on " + p.host + ":" +
                                                        std::to_string(port) +
                                                        " (--host/--port: in use or not allowed)");
  }
  // httplib 0.11 listens with a backlog of 5 (compiled into Debian's library): a burst of clients connecting
  // at once would see dropped SYNs and one-second retries. Listening again on the bound socket raises it.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  return port;
}

void HttpServer::serve() {
  impl_->server.listen_after_bind();
}

void HttpServer::stop() {
  if (impl_) impl_->server.stop();
}

}  // namespace tandem::serve
