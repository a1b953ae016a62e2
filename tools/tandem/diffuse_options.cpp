// The canvas-diffusion flags and their run (diffuse_options.h).
#include "diffuse_options.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "core/error.h"
#include "flag_checks.h"
#include "tandem/chat.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

void add_diffusion_options(CLI::App* cmd, DiffuseOptions* o) {
  const char* g = "Canvas diffusion";
  cmd->add_option("--diffusion-steps", o->steps,
                  "Denoising steps per block at most (0: the model's diffusion.eb_max_steps, else 48)")
      ->group(g);
  cmd->add_option("--diffusion-blocks", o->blocks, "Canvas blocks at most (0: ceil(-n / canvas_length))")
      ->group(g);
  cmd->add_option("--diffusion-eb", o->eb, "The entropy-bound sampler: on (the only canvas sampler)")
      ->group(g);
  cmd->add_option("--diffusion-kv-cache", o->kv_cache,
                  "Prompt K/V computed once per block (PREFILL) and read by every step: auto|on|off")
      ->group(g);
  cmd->add_option("--diffusion-kv-type", o->kv_type,
                  "K/V store precision: auto (f32; f16 on a GPU for non-f32 weights with TANDEM_CANVAS_KV_F16=1), "
                  "f32, f16 or bf16 (f16/bf16: the canvas attention on tensor cores)")
      ->group(g);
  cmd->add_option("--diffusion-gpu-sampling", o->gpu_sampling,
                  "Self-conditioning buffers on the GPU: auto|on|off")
      ->group(g);
  cmd->add_option(
         "--diffusion-gpu-sample-reduce", o->gpu_sample_reduce,
         "Per-row argmax/entropy/sample on the GPU (3 numbers per row cross to the host): auto|on|off")
      ->group(g);
  cmd->add_option("--diffusion-t-min", o->t_min,
                  "Temperature at the end of the schedule (default: the model's)")
      ->default_str("model")
      ->group(g);
  cmd->add_option("--diffusion-t-max", o->t_max, "Temperature of the first step (default: the model's)")
      ->default_str("model")
      ->group(g);
  cmd->add_option("--diffusion-entropy-bound", o->entropy_bound,
                  "Entropy budget of the positions accepted per step (default: the model's)")
      ->default_str("model")
      ->group(g);
  cmd->add_option("--diffusion-stability-threshold", o->stability_threshold,
                  "Steps the argmax canvas must stay unchanged to stop (default: the model's)")
      ->default_str("model")
      ->group(g);
  cmd->add_option("--diffusion-confidence-threshold", o->confidence_threshold,
                  "Mean entropy under which a stable canvas stops (default: the model's)")
      ->default_str("model")
      ->group(g);
  cmd->add_flag("--visual", o->visual,
                "Watch the canvas settle in the terminal (off when stdout is not a TTY)")
      ->group(g);
}

Toggle parse_toggle(const std::string& value, const char* flag) {
  if (value == "auto") return Toggle::Auto;
  if (value == "on") return Toggle::On;
  if (value == "off") return Toggle::Off;
  throw Error(std::string(flag) + " must be auto, on or off, got '" + value + "'");
}

std::optional<KvType> parse_diffusion_kv_type(const std::string& value) {
  return parse_kv_type_flag(value, "--diffusion-kv-type", /*allow_auto=*/true);
}

void check_diffusion_options(const DiffuseOptions& o) {
  check_int_flag("--diffusion-steps", o.steps, 0, 100000, "0 = the model's default");
  check_int_flag("--diffusion-blocks", o.blocks, 0, 1 << 20, "0 = from -n");
  check(o.eb == "on" || o.eb == "auto",
        o.eb == "off"
            ? std::string("--diffusion-eb off: the entropy-bound sampler is the only sampler for canvas "
                          "models; leave it on")
            : "--diffusion-eb must be on (or auto), got '" + o.eb + "'");
  parse_toggle(o.kv_cache, "--diffusion-kv-cache");
  parse_toggle(o.gpu_sampling, "--diffusion-gpu-sampling");
  parse_toggle(o.gpu_sample_reduce, "--diffusion-gpu-sample-reduce");
  parse_diffusion_kv_type(o.kv_type);
  // Given values (>= 0 means given for the real-valued flags; a negative one is rejected by name).
  auto real = [](const char* flag, double v, bool positive) {
    if (v == -1) return;  // not given
    check(std::isfinite(v) && (positive ? v > 0 : v >= 0),
          std::string(flag) + (positive ? " must be a finite number > 0" : " must be a finite number >= 0") +
              ", got " + std::to_string(v));
  };
  real("--diffusion-t-min", o.t_min, false);
  real("--diffusion-t-max", o.t_max, true);
  real("--diffusion-entropy-bound", o.entropy_bound, true);
  real("--diffusion-confidence-threshold", o.confidence_threshold, true);
  check(o.t_min == -1 || o.t_max == -1 || o.t_min < o.t_max,
        "--diffusion-t-min must be below --diffusion-t-max, got " + std::to_string(o.t_min) + " and " +
            std::to_string(o.t_max));
  check(o.stability_threshold >= -1,
        "--diffusion-stability-threshold must be >= 0, got " + std::to_string(o.stability_threshold));
}

void check_run_options(const DiffuseOptions& o) {
  check_diffusion_options(o);
  check_int_flag("-n", o.n_predict, 1, 1 << 24, "tokens to generate");
  check(o.seed >= -1, "--seed must be >= 0, or -1 for a random seed, got " + std::to_string(o.seed));
  check(o.seed < (int64_t(1) << 32),
        "--seed must be below 2^32 (the sampler's mt19937 takes 32 bits), got " + std::to_string(o.seed));
  check(o.prompt.empty() || o.prompt_ids.empty(),
        "give the prompt either as text (-p) or as ids (--prompt-ids)");
  check(!o.prompt.empty() || !o.prompt_ids.empty(), "give a prompt with -p (or --prompt-ids)");
}

bool is_canvas_model(const Model& model) {
  try {
    canvas_model_info(model);
    return true;
  } catch (const Error&) {
    return false;
  }
}

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    check(!item.empty() && end && *end == '\0' && v >= 0 && v <= INT32_MAX,
          "--prompt-ids: '" + item + "' is not a token id (expected comma-separated integers)");
    ids.push_back(int32_t(v));
  }
  check(!ids.empty(), "--prompt-ids: no ids in '" + s + "'");
  return ids;
}

// The EB parameters: the model's (GGUF diffusion.eb_*, else the code's defaults), then the flags given.
EbParams eb_params(const DiffuseOptions& o, const CanvasModelInfo& info, uint32_t seed) {
  EbParams p = info.eb_defaults;
  if (o.steps > 0) p.max_steps = o.steps;
  if (o.t_min != -1) p.t_min = float(o.t_min);
  if (o.t_max != -1) p.t_max = float(o.t_max);
  if (o.entropy_bound != -1) p.entropy_bound = float(o.entropy_bound);
  if (o.stability_threshold != -1) p.stability_threshold = o.stability_threshold;
  if (o.confidence_threshold != -1) p.confidence_threshold = float(o.confidence_threshold);
  p.seed = seed;
  try {
    check_eb_params(p);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the model's defaults combined with the --diffusion-* flags)");
  }
  return p;
}

// Per-step progress on stderr: one line per step, rewritten in place on a terminal.
class Progress {
 public:
  Progress() : tty_(isatty(fileno(stderr)) != 0), t0_(std::chrono::steady_clock::now()) {}
  void step(const DiffusionStep& s) {
    ++steps_;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "%sblock %d step %d/%d  t %.3f  accepted %d  mean entropy %.4f%s  %.2f steps/s%s",
                 tty_ ? "\r" : "", s.block, s.step + 1, s.max_steps, double(s.temperature), s.n_accepted,
                 s.mean_entropy, s.stable ? " stable" : "", secs > 0 ? steps_ / secs : 0.0,
                 tty_ ? "\x1b[K" : "\n");
    std::fflush(stderr);
  }
  void end() {
    if (tty_ && steps_ > 0) std::fputc('\n', stderr);
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  int steps_ = 0;
};

}  // namespace

void run_diffusion(const DiffuseOptions& o, const std::shared_ptr<Model>& model,
                   const std::string& model_path) {
  check_run_options(o);
  CanvasModelInfo info;
  try {
    info = canvas_model_info(*model);
  } catch (const Error& e) {
    throw Error("'" + model_path + "' cannot run canvas diffusion: " + e.what());
  }
  uint64_t seed = uint64_t(o.seed);
  if (o.seed < 0) seed = std::random_device{}();
  DiffusionParams params;
  params.eb = eb_params(o, info, uint32_t(seed));
  params.n_predict = o.n_predict;
  params.n_blocks = o.blocks;
  params.gpu_sample_reduce = parse_toggle(o.gpu_sample_reduce, "--diffusion-gpu-sample-reduce");
  params.eog_ids = model->info().eos_ids;

  const tokenizer::Tokenizer* tok = nullptr;
  if (o.prompt_ids.empty() || !o.ids) tok = &model->tokenizer();
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
  } else if (o.no_chat) {
    prompt = tok->encode(o.prompt, /*add_special=*/true, /*parse_special=*/true);
  } else {
    // The model's chat template (D.7): the prompt is one user turn and the assistant's opening.
    const ChatTemplate tmpl = ChatTemplate::from_model(*model, o.chat_template);
    prompt =
        tok->encode(tmpl.render({{"user", o.prompt}}, /*add_generation_prompt=*/true), /*add_special=*/false,
                    /*parse_special=*/true);
  }
  check(!prompt.empty(), "the prompt is empty after tokenization");

  CanvasOptions copt;
  copt.kv_cache = parse_toggle(o.kv_cache, "--diffusion-kv-cache");
  copt.gpu_sampling = parse_toggle(o.gpu_sampling, "--diffusion-gpu-sampling");
  copt.kv_type = parse_diffusion_kv_type(o.kv_type);
  params.max_prefix = copt.max_prompt;
  std::unique_ptr<CanvasSource> source = make_canvas_source(model, copt);
  std::fprintf(stderr,
               "diffusion: canvas %d, %d steps at most, t %.3g..%.3g, entropy bound %.3g, seed %llu; %s\n",
               info.canvas_length, params.eb.max_steps, double(params.eb.t_max), double(params.eb.t_min),
               double(params.eb.entropy_bound), (unsigned long long)seed, source->describe().c_str());

  const bool visual = o.visual && isatty(fileno(stdout)) != 0;
  if (o.visual && !visual) std::fprintf(stderr, "diffusion: --visual is off: stdout is not a terminal\n");
  Progress progress;
  const auto t0 = std::chrono::steady_clock::now();
  const DiffusionResult r = diffuse(*source, prompt, params, [&](const DiffusionStep& s) {
    progress.step(s);
    if (visual) {
      // Clear the screen and draw the block's current argmax canvas.
      std::string text = tok ? tok->decode(s.argmax) : std::string();
      std::printf("\x1b[2J\x1b[Hblock %d  step %d/%d  accepted %d/%zu\n\n%s\n", s.block, s.step + 1,
                  s.max_steps, s.n_accepted, s.argmax.size(), text.c_str());
      std::fflush(stdout);
    }
    return true;
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.end();
  if (visual) std::printf("\x1b[2J\x1b[H");

  if (o.ids) {
    std::string line;
    for (size_t i = 0; i < r.tokens.size(); ++i) line += (i ? " " : "") + std::to_string(r.tokens[i]);
    std::printf("%s\n", line.c_str());
  } else {
    std::printf("%s\n", tok->decode(r.tokens).c_str());
  }
  std::fflush(stdout);
  double prefill = 0;
  for (const DiffusionBlockStats& b : r.blocks) prefill += b.begin_seconds;
  std::fprintf(
      stderr,
      "diffusion: %zu tokens in %zu block%s, %d steps in %.3f s (%.2f steps/s, %.2f tokens/s; prefill "
      "%.3f s); sampling reduction on the %s\n",
      r.tokens.size(), r.blocks.size(), r.blocks.size() == 1 ? "" : "s", r.total_steps, secs,
      secs > 0 ? r.total_steps / secs : 0.0, secs > 0 ? double(r.tokens.size()) / secs : 0.0, prefill,
      r.device_reduce ? "device" : "host");
}

}  // namespace tandem::cli
