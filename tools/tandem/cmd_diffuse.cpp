// `tandem diffuse -m MODEL.gguf -p PROMPT [-n N] [--seed S] [--diffusion-* ...] [--visual] [--devices LIST
// --split-mode MODE]`: canvas diffusion (DiffusionGemma) with the entropy-bound sampler and the multi-block
// driver of the library (tandem/diffusion.h). The flags and the run are in diffuse_options.h (shared with
// `generate`, which routes canvas models here); the split flags are split_options.h's.
#include <memory>
#include <string>

#include "commands.h"
#include "core/thread_pool.h"
#include "diffuse_options.h"
#include "diffuse_replay.h"
#include "eval/default_model.h"
#include "flag_checks.h"
#include "split_options.h"

namespace tandem::cli {
namespace {

struct DiffuseArgs {
  std::string model;
  int threads = 0;
  DiffuseOptions d;
  SplitOptions split;
  ReplayOptions replay;  // hidden: the sampler over recorded logits (diffuse_replay.h)
};

void run_diffuse(const DiffuseArgs& a) {
  check_threads_flag(a.threads);
  if (!a.replay.logits.empty()) return run_replay(a.replay, a.d);
  check_run_options(a.d);
  ModelParams mp;
  mp.n_threads = a.threads;
  apply(a.split, mp);  // bad split flags fail here, before any file is read
  const std::string path =
      a.model.empty() ? eval::default_model_path(TANDEM_SOURCE_DIR, eval::kDefaultDiffusionModelFile) : a.model;
  const auto model = Model::load(path, mp);
  run_diffusion(a.d, model, path);
}

}  // namespace

void add_diffuse_command(CLI::App& app) {
  auto args = std::make_shared<DiffuseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "diffuse", "Generate text with a canvas diffusion model (DiffusionGemma; entropy-bound sampler)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-m,--model", args->model, "Model file (GGUF, a canvas diffusion model)");
  cmd->add_option("-p,--prompt", args->d.prompt, "Prompt text (rendered with the model's chat template)");
  cmd->add_option("--prompt-ids", args->d.prompt_ids,
                  "Prompt as token ids, comma-separated (no chat template)");
  cmd->add_option("-n,--n-predict", args->d.n_predict,
                  "Tokens to generate (whole canvases: ceil(n / canvas))");
  cmd->add_option("--seed", args->d.seed,
                  "Random seed of the sampler (-1: random); the same for every block");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all cores)");
  cmd->add_flag("--ids", args->d.ids, "Print the generated token ids instead of text");
  cmd->add_flag("--no-chat-template", args->d.no_chat, "Tokenize the prompt as it is (no chat template)");
  cmd->add_option("--chat-template", args->d.chat_template,
                  "Chat template: a built-in name or a .jinja file (default: the model's)");
  add_diffusion_options(cmd, &args->d);
  add_split_options(cmd, &args->split);
  add_replay_options(cmd, &args->replay);
  cmd->callback([args] {
    if (parse_only()) return;
    run_diffuse(*args);
  });
}

}  // namespace tandem::cli
