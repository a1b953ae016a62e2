// `tandem chat`: an interactive terminal chat. Each turn renders the whole conversation with the chat
// template (include/tandem/chat.h), tokenizes it (chat markup as special tokens) and prefills only the tokens
// after the part already in the KV cache (the conversation so far stays in sequence 0 across turns), then
// streams the answer. Ctrl-C stops the current answer and returns to the prompt; Ctrl-C at the prompt, EOF or
// /exit ends the program; /reset forgets the conversation (the --system message stays).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "run_options.h"
#include "split_options.h"
#include "tandem/batch.h"
#include "tandem/chat.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct ChatArgs {
  std::string model;
  std::string system;
  std::string chat_template;
  int n_predict = -1;
  SamplingFlags sampling;
  int ctx = 4096;
  int threads = 0;
  int batch = 512;
  bool verbose = false;
  bool ignore_eos = false;
  SplitOptions split;
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  g_interrupted.store(true);
}

// SIGINT sets a flag (no SA_RESTART, so a blocked read returns EINTR) instead of ending the process.
struct SigintGuard {
  struct sigaction old {};
  SigintGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &old);
  }
  ~SigintGuard() { sigaction(SIGINT, &old, nullptr); }
};

enum class ReadResult { Line, Eof, Interrupted };

// One line from stdin (without the newline), through read(2) so that Ctrl-C interrupts the wait.
class LineReader {
 public:
  ReadResult read_line(std::string& line) {
    line.clear();
    while (true) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return ReadResult::Line;
      }
      if (g_interrupted.load()) return ReadResult::Interrupted;
      char chunk[4096];
      const ssize_t n = ::read(0, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (buf_.empty()) return ReadResult::Eof;
        line.swap(buf_);
        return ReadResult::Line;
      }
      buf_.append(chunk, size_t(n));
    }
  }

 private:
  std::string buf_;
};

void print(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

class ChatLoop {
 public:
  ChatLoop(const ChatArgs& a, std::shared_ptr<Model> model, ChatTemplate tmpl, SamplingParams sp)
      : a_(a),
        model_(model),
        tok_(model->tokenizer()),
        tmpl_(std::move(tmpl)),
        sampler_(sp),
        session_(model, session_params(a)) {
    if (!a.system.empty()) messages_.push_back({"system", a.system});
  }

  void run() {
    LineReader reader;
    std::string line;
    while (true) {
      g_interrupted.store(false);  // before the prompt shows: a Ctrl-C from then on is one at the prompt
      print("> ");
      const ReadResult r = reader.read_line(line);
      if (r != ReadResult::Line) {
        print("\n");
        return;
      }
      if (line.empty()) continue;
      if (line == "/exit") return;
      if (line == "/reset") {
        reset();
        std::fprintf(stderr, "[conversation reset]\n");
        continue;
      }
      answer(line);
    }
  }

 private:
  static SessionParams session_params(const ChatArgs& a) {
    SessionParams sp;
    sp.n_ctx = a.ctx;
    sp.n_seq_max = 1;
    sp.n_batch = a.batch;
    return sp;
  }

  void reset() {
    messages_.resize(a_.system.empty() ? 0 : 1);
    session_.seq_clear(0);
    in_kv_.clear();
    sampler_.reset();
  }

  // Decodes tokens at the end of sequence 0; the last row computes logits.
  void decode(const std::vector<int32_t>& tokens) {
    Batch b;
    const int32_t start = int32_t(in_kv_.size());
    for (size_t i = 0; i < tokens.size(); ++i)
      b.add(tokens[i], start + int32_t(i), 0, i + 1 == tokens.size());
    session_.decode(b);
    in_kv_.insert(in_kv_.end(), tokens.begin(), tokens.end());
    last_row_ = b.size() - 1;
  }

  void answer(const std::string& user_text) {
    messages_.push_back({"user", user_text});
    std::vector<int32_t> prompt;
    try {
      prompt = tok_.encode(tmpl_.render(messages_, /*add_generation_prompt=*/true), /*add_special=*/false,
                           /*parse_special=*/true);
    } catch (const Error& e) {
      messages_.pop_back();
      std::fprintf(stderr, "error: %s\n", e.what());
      return;
    }
    if (int64_t(prompt.size()) >= a_.ctx) {
      messages_.pop_back();
      std::fprintf(
          stderr,
          "error: the conversation needs %zu tokens but the context holds %d (--ctx); /reset to start "
          "over\n",
          prompt.size(), a_.ctx);
      return;
    }
    // Reuse the cached prefix; at least the last prompt token is decoded again for its logits.
    size_t keep = 0;
    while (keep < in_kv_.size() && keep < prompt.size() && in_kv_[keep] == prompt[keep]) ++keep;
    if (keep == prompt.size()) --keep;
    session_.seq_remove(0, int32_t(keep));
    in_kv_.resize(keep);
    const std::vector<int32_t> fresh(prompt.begin() + std::ptrdiff_t(keep), prompt.end());
    if (a_.verbose) std::fprintf(stderr, "[prompt %zu tokens, %zu reused]\n", prompt.size(), keep);
    sampler_.accept(std::span<const int32_t>(fresh));
    decode(fresh);

    tokenizer::StreamingDetokenizer detok(tok_);
    std::string reply;
    const char* why = nullptr;
    for (int n = 0;; ++n) {
      if (g_interrupted.load()) {
        why = "interrupted";
        break;
      }
      if (a_.n_predict >= 0 && n >= a_.n_predict) break;
      const int32_t id = sampler_.sample(session_.logits(last_row_));
      if (!a_.ignore_eos && tok_.is_end_of_generation(id)) break;
      sampler_.accept(id);
      const std::string piece = detok.push(id);
      reply += piece;
      print(piece);
      if (int64_t(in_kv_.size()) + 1 > a_.ctx) {  // no room to decode it; the next turn re-tokenizes anyway
        why = "context full: /reset to start over";
        break;
      }
      decode({id});
    }
    const std::string rest = detok.flush();
    reply += rest;
    print(rest + "\n");
    if (why) std::fprintf(stderr, "[%s]\n", why);
    messages_.push_back({"assistant", reply});
  }

  const ChatArgs& a_;
  std::shared_ptr<Model> model_;
  const tokenizer::Tokenizer& tok_;
  ChatTemplate tmpl_;
  Sampler sampler_;
  Session session_;
  std::vector<ChatMessage> messages_;
  std::vector<int32_t> in_kv_;  // the tokens of sequence 0, position order
  size_t last_row_ = 0;
};

void run_chat(const ChatArgs& a) {
  check(a.n_predict >= -1,
        "-n must be >= -1 (-1: until the end of the answer), got " + std::to_string(a.n_predict));
  check_run_flags(a.ctx, a.batch, a.threads);
  check_sampling_flags(a.sampling);
  if (!a.chat_template.empty() && a.chat_template.find('/') == std::string::npos &&
      a.chat_template.find(".jinja") == std::string::npos)
    ChatTemplate::builtin(a.chat_template);  // an unknown name fails before the model loads

  const auto model = load_model(model_path_or_default(a.model), a.threads, a.split).model;
  try {
    model->tokenizer();
  } catch (const Error& e) {
    throw Error(std::string("chat needs the model's tokenizer: ") + e.what());
  }
  ChatTemplate tmpl = ChatTemplate::from_model(*model, a.chat_template);

  SigintGuard guard;
  ChatLoop(a, model, std::move(tmpl), sampling_params(a.sampling)).run();
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive chat with a model in the terminal");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-m,--model", args->model, "GGUF model file (default: the shipped small model)");
  cmd->add_option("--system", args->system, "System message at the start of the conversation");
  cmd->add_option(
      "--chat-template", args->chat_template,
      "Chat template: a built-in name (chatml, llama3, gemma, mistral, deepseek) or a .jinja file; "
      "default: the model's tokenizer.chat_template");
  cmd->add_option("-n,--n-predict", args->n_predict, "Most tokens per answer (-1: until the answer ends)");
  add_sampling_flags(cmd, &args->sampling);
  cmd->add_option("-c,--ctx", args->ctx, "KV cache size in positions (the whole conversation)");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all cores)");
  cmd->add_option("-b,--batch", args->batch, "Rows per forward pass during prompt processing");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not end answers at end-of-generation tokens (tests)");
  cmd->add_flag("-v,--verbose", args->verbose, "Report prompt tokens decoded and reused per turn on stderr");
  add_split_options(cmd, &args->split);
  cmd->callback([args] {
    if (parse_only()) return;
    run_chat(*args);
  });
}

}  // namespace tandem::cli
