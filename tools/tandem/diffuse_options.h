// The canvas-diffusion flags (tandem diffuse, and tandem generate on a canvas model) and the run behind them:
// spelled, documented and checked in one place, like split_options.h.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tandem/diffusion.h"
#include "tandem/model.h"

namespace tandem::cli {

struct DiffuseOptions {
  // shared with generate's own flags (generate fills them from its -p / -n / --seed / --ids / --prompt-ids)
  std::string prompt;
  std::string prompt_ids;  // "1,2,3": skips the chat template and the tokenizer for the prompt
  int n_predict = 256;
  int64_t seed = -1;  // -1: random
  bool ids = false;

  // the diffusion flags (add_diffusion_options)
  int steps = 0;   // --diffusion-steps; 0: the GGUF's diffusion.eb_max_steps, else 48
  int blocks = 0;  // --diffusion-blocks; 0: ceil(n / canvas_length)
  std::string eb = "on";
  std::string kv_cache = "auto", gpu_sampling = "auto", gpu_sample_reduce = "auto";
  std::string kv_type = "auto";  // --diffusion-kv-type
  double t_min = -1, t_max = -1, entropy_bound = -1, confidence_threshold = -1;  // < 0: not given
  int stability_threshold = -1;
  bool visual = false;
  bool no_chat = false;
  std::string chat_template;
};

// Registers the --diffusion-* flags and --visual (group "Canvas diffusion").
void add_diffusion_options(CLI::App* cmd, DiffuseOptions* o);

// "auto" / "on" / "off" -> Toggle; anything else is an Error naming the flag.
Toggle parse_toggle(const std::string& value, const char* flag);
// --diffusion-kv-type: "auto" -> unset (CanvasOptions::kv_type), "f32" / "f16" / "bf16"; else an Error.
std::optional<KvType> parse_diffusion_kv_type(const std::string& value);

// Checks the values of the --diffusion-* flags (no file is read): an Error names the flag and the range.
void check_diffusion_options(const DiffuseOptions& o);
// The same plus the run's own values: -n >= 1, --seed, one prompt.
void check_run_options(const DiffuseOptions& o);

// Whether model is a canvas diffusion model (canvas_model_info succeeds).
bool is_canvas_model(const Model& model);

// Runs canvas diffusion on a loaded model with the flags and prints the response (text, or --ids) to stdout
// and the per-step progress and a summary to stderr. model_path: for messages. Throws Error when the model
// is not a canvas model (naming the path) or a flag does not fit it.
void run_diffusion(const DiffuseOptions& o, const std::shared_ptr<Model>& model,
                   const std::string& model_path);

}  // namespace tandem::cli
