// `tandem perplexity`: perplexity of a model over a text file, in windows (see src/eval/perplexity.h for the
// exact windows and the error estimate), with a progress bar on stderr and the figure on stdout.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "eval/default_model.h"
#include "eval/perplexity.h"
#include "flag_checks.h"
#include "split_options.h"
#include "tandem/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

struct PerplexityOptions {
  std::string model;
  std::string file;
  int32_t ctx = 512;
  int32_t stride = 0;
  int32_t threads = 0;
  int32_t batch = 512;
  bool no_progress = false;
  SplitOptions split;
};

std::string read_text_file(const std::string& path) {
  return read_regular_file(path, "text file");
}

void draw_progress(size_t done, size_t total, const eval::NllStats& stats) {
  constexpr int kWidth = 30;
  const int filled = total ? int(double(done) / double(total) * kWidth) : kWidth;
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  std::fprintf(stderr, "\r[%s] %zu/%zu windows, PPL so far %.4f", bar.c_str(), done, total, stats.ppl());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void run_perplexity(const PerplexityOptions& o) {
  const std::string model_path = o.model.empty() ? eval::default_model_path(TANDEM_SOURCE_DIR) : o.model;
  check_threads_flag(o.threads);
  check_int_flag("--ctx", o.ctx, 2, 1 << 24, "tokens per window");
  check_min_flag("--stride", o.stride, 0, "0 = non-overlapping windows");
  check_min_flag("--batch", o.batch, 1, "rows per forward pass");
  ModelParams mp;
  mp.n_threads = o.threads;
  apply(o.split, mp);  // bad split flags fail here, before any file is read
  const std::string text = read_text_file(o.file);

  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Model> model = Model::load(model_path, mp);
  const tokenizer::Tokenizer& tok = model->tokenizer();
  // BOS in front when the vocabulary asks for it; special-token text in the file is plain text.
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);

  eval::PerplexityParams pp;
  pp.ctx = o.ctx;
  pp.stride = o.stride;
  pp.n_batch = o.batch;
  pp.replace_first_with_bos = tok.add_bos();
  pp.bos_id = tok.bos();
  std::fprintf(stderr, "perplexity: %s, %zu bytes -> %zu tokens, ctx %d, stride %d%s\n", model_path.c_str(),
               text.size(), tokens.size(), o.ctx, o.stride,
               pp.replace_first_with_bos ? ", BOS first in each window" : "");
  eval::PerplexityProgress progress;
  if (!o.no_progress) progress = draw_progress;
  const eval::PerplexityResult r = eval::compute_perplexity(model, tokens, pp, progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  std::fprintf(stderr, "%lld tokens scored in %lld windows, mean NLL %.6f, %.1f s\n",
               static_cast<long long>(r.tokens_scored), static_cast<long long>(r.windows), r.mean_nll,
               seconds);
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto opts = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a model over a text file. Default windows: non-overlapping, --ctx tokens each, the "
      "second "
      "half of each scored (as llama-perplexity); --stride S: sliding windows every S tokens, each scoring "
      "only tokens not scored before. Prints 'PPL = x +/- err' (standard error).");
  cmd->add_option("-m,--model", opts->model, "GGUF model (default: the model shipped in models/)");
  cmd->add_option("-f,--file", opts->file, "text file to score")->required();
  cmd->add_option("--ctx", opts->ctx, "tokens per window");
  cmd->add_option("--stride", opts->stride, "sliding-window step in tokens (0: non-overlapping windows)");
  cmd->add_option("-t,--threads", opts->threads, "CPU threads (0: all)");
  cmd->add_option("-b,--batch", opts->batch, "rows per forward pass");
  cmd->add_flag("--no-progress", opts->no_progress, "no progress bar on stderr");
  add_split_options(cmd, &opts->split);
  cmd->callback([opts] {
    if (parse_only()) return;
    run_perplexity(*opts);
  });
}

}  // namespace tandem::cli
