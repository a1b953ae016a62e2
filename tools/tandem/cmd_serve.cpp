// `tandem serve -m MODEL.gguf [--host H] [--port P] [--parallel N] [--ctx N] [--kv-unified] [--batch N]
// [--queue-timeout S] [--max-queue N] [--chat-template NAME] [--api-key KEY] [--devices LIST --split-mode
// MODE] [--draft FILE --draft-max N ...] [--batch-invariant]`: an OpenAI-compatible HTTP server (src/serve/).
//
// --draft FILE: speculative decoding with a draft model or a DFlash drafter (the kind from the file's
// architecture, or --spec draft|dflash, which must agree); the scheduler verifies every generating request's
// draft in the step's batch. A canvas diffusion model (-m) answers through the diffusion driver.
//
// Prints "listening on http://HOST:PORT" on stdout once it accepts connections (--port 0: a free port, so
// tests read the port from that line). Runs until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "diffuse_options.h"
#include "gguf/gguf.h"
#include "run_options.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "spec_options.h"
#include "split_options.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int ctx = 4096;
  int batch = 512;
  int threads = 0;
  bool kv_unified = false;
  double queue_timeout = 30.0;
  int max_queue = 1024;
  std::string api_key;
  std::string alias;
  std::string chat_template;
  int64_t max_body = 1 << 20;
  bool batch_invariant = false;
  std::string device_sampling = "auto";
  SplitOptions split;
  SpecOptions spec;
};

serve::HttpServer* g_server = nullptr;

void on_signal(int) {
  if (g_server) g_server->stop();
}

void run_serve(const ServeArgs& a) {
  check(a.port >= 0 && a.port <= 65535,
        "--port must be in [0, 65535] (0: any free port), got " + std::to_string(a.port));
  check(a.parallel >= 1, "--parallel must be at least 1, got " + std::to_string(a.parallel));
  check(a.ctx >= 1, "--ctx must be at least 1, got " + std::to_string(a.ctx));
  check(a.batch >= 1, "--batch must be at least 1, got " + std::to_string(a.batch));
  check(a.threads >= 0 && a.threads <= ThreadPool::kMaxThreads, "--threads must be in [0, " +
                                                                    std::to_string(ThreadPool::kMaxThreads) +
                                                                    "], got " + std::to_string(a.threads));
  check(a.queue_timeout > 0, "--queue-timeout must be positive (seconds)");
  check(a.max_queue >= 0, "--max-queue must be >= 0, got " + std::to_string(a.max_queue));
  check(a.max_body >= 1024, "--max-body must be at least 1024 bytes, got " + std::to_string(a.max_body));
  const SpeculativeParams spec = check_spec_options(a.spec);
  // The drafter kind from its architecture (as generate does), checked against --spec before any model loads.
  std::string kind;
  if (a.spec.enabled())
    kind = spec_kind(a.spec, gguf::GgufFile::open(a.spec.draft).get_string("general.architecture"));
  const LoadedModel loaded = load_model(model_path_or_default(a.model), a.threads, a.split);
  const std::shared_ptr<Model>& model = loaded.model;
  const MeshSpec& mesh = loaded.mesh;
  std::shared_ptr<Model> draft;
  if (a.spec.enabled()) {
    ModelParams dmp;
    dmp.n_threads = a.threads;
    dmp.device = mesh.devices[size_t(mesh.main_device)].to_string();  // beside the target's logits
    // A DFlash drafter reads the target's hidden states and usually borrows its token_embd / output.
    if (kind == "dflash") dmp.share_weights_from = model;
    draft = Model::load(a.spec.draft, dmp);
  }

  serve::SchedulerParams sp;
  sp.n_slots = a.parallel;
  sp.n_ctx = a.ctx;
  sp.kv_unified = a.kv_unified;
  sp.n_batch = a.batch;
  sp.queue_timeout_s = a.queue_timeout;
  sp.max_queue = a.max_queue;
  sp.batch_invariant = a.batch_invariant;
  sp.device_sampling = parse_toggle(a.device_sampling, "--device-sampling");
  sp.spec = spec;
  check(a.kv_unified || a.ctx / a.parallel >= 64,
        "--ctx " + std::to_string(a.ctx) + " split over --parallel " + std::to_string(a.parallel) +
            " slots leaves fewer than 64 positions each; raise --ctx or use --kv-unified");
  serve::Scheduler scheduler(model, SessionParams{}, sp, draft);

  serve::HttpParams hp;
  hp.host = a.host;
  hp.port = a.port;
  hp.api_key = a.api_key;
  hp.model_id = a.alias;
  hp.chat_template = a.chat_template;
  hp.max_body = size_t(a.max_body);
  serve::HttpServer server(scheduler, hp);
  const int port = server.bind();
  g_server = &server;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::printf("listening on http://%s:%d (%s)\n", a.host.c_str(), port,
              scheduler.is_canvas()
                  ? "canvas diffusion, one request at a time"
                  : (std::to_string(a.parallel) + " slots, ctx " + std::to_string(a.ctx) +
                     (a.kv_unified ? ", unified KV" : "") +
                     (scheduler.is_speculative()
                          ? ", speculative (" + kind + ", draft-max " + std::to_string(spec.draft_max) + ")"
                          : std::string()) +
                     (scheduler.samples_on_device() ? ", sampling on the device" : ", sampling on the host"))
                        .c_str());
  std::fflush(stdout);
  server.serve();
  g_server = nullptr;
  scheduler.stop();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-m,--model", args->model, "Model file (GGUF); default: the shipped small model");
  cmd->add_option("--host", args->host, "Address to listen on");
  cmd->add_option("--port", args->port, "Port (0: any free port, printed)");
  cmd->add_option("--parallel", args->parallel, "Slots: requests decoded together");
  cmd->add_option("-c,--ctx", args->ctx, "KV cache positions in total (per slot: ctx / parallel)");
  cmd->add_flag("--kv-unified", args->kv_unified, "One KV pool for all slots instead of per-slot partitions");
  cmd->add_option("-b,--batch", args->batch, "Token budget of one step (decode rows + prompt chunks)");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all cores)");
  cmd->add_option("--queue-timeout", args->queue_timeout,
                  "Seconds a request waits for a slot / KV room before a 503");
  cmd->add_option("--max-queue", args->max_queue,
                  "Requests that may wait for a slot; more are refused at once with a 503");
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' (401 otherwise)");
  cmd->add_option("--alias", args->alias, "Model name reported by /v1/models (default: the file's stem)");
  cmd->add_option("--chat-template", args->chat_template, "Chat template name or .jinja file");
  cmd->add_option("--max-body", args->max_body, "Largest request body in bytes (413 above)");
  cmd->add_flag("--batch-invariant", args->batch_invariant,
                "Every row's logits as if decoded alone, also on GPUs: the same seed gives the same text "
                "whatever else runs (slower prefill on GPUs; the CPU is batch-invariant anyway)");
  cmd->add_option("--device-sampling", args->device_sampling,
                  "auto|on|off: draw the next tokens on the model's output device, only the ids back to the host "
                  "(auto: on for a GPU; requests with penalties draw on the host)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_split_options(cmd, &args->split);
  add_spec_options(cmd, &args->spec);
  cmd->callback([args]() {
    if (parse_only()) return;
    run_serve(*args);
  });
}

}  // namespace tandem::cli
