// `tandem quantize IN.gguf OUT.gguf TYPE [--threads N]`: requantize a GGUF model's weight matrices
// (see quant/quantize_model.h for which tensors get which type).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/interrupt_cleanup.h"
#include "flag_checks.h"
#include "quant/quantize_model.h"

namespace tandem::cli {
namespace {

struct QuantizeArgs {
  std::string input;
  std::string output;
  std::string type;
  int threads = 0;
  bool force = false;
  bool quiet = false;
};

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

// One line per tensor on a pipe or file; on a terminal, a single line redrawn in place.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(isatty(fileno(stderr)) != 0) {}

  void update(size_t index, size_t count, const quant::TensorPlan& t, double fraction) {
    if (!enabled_) return;
    const bool new_tensor = index != last_index_;
    last_index_ = index;
    if (new_tensor && !t.note.empty() && t.note.find("instead") != std::string::npos) {
      if (tty_ && drawn_) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "note: %s: %s\n", t.name.c_str(), t.note.c_str());
      drawn_ = false;
    }
    if (!tty_ && !new_tensor) return;
    const int width = 24;
    const int filled = int(fraction * width + 0.5);
    std::string bar(size_t(filled), '#');
    bar.resize(size_t(width), '.');
    const std::string action = t.convert ? std::string(dtype_name(t.from)) + " -> " + dtype_name(t.to)
                                         : std::string("copy ") + dtype_name(t.to);
    std::fprintf(stderr, "%s[%s] %5.1f%% %4zu/%zu %-40s %s%s", tty_ ? "\r" : "", bar.c_str(),
                 100.0 * fraction, index + 1, count, t.name.c_str(), action.c_str(), tty_ ? "\x1b[K" : "\n");
    std::fflush(stderr);
    drawn_ = true;
  }

  void finish() {
    if (enabled_ && tty_ && drawn_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  size_t last_index_ = size_t(-1);
};

void run_quantize(const QuantizeArgs& a) {
  const quant::QuantTarget target = quant::parse_quant_target(a.type);
  ProgressBar bar(!a.quiet);
  check_threads_flag(a.threads);
  // rename() would replace a read-only file without asking (even as root): a file with no write bit set was
  // protected by its owner, so replacing it needs --force.
  struct stat st {};
  if (::stat(a.output.c_str(), &st) == 0 && (st.st_mode & 0222) == 0)
    check(a.force, "output '" + a.output + "' is read-only; pass --force to replace it");
  install_interrupt_cleanup();  // Ctrl-C leaves no OUTPUT.tmp behind
  quant::QuantizeOptions o;
  o.n_threads = a.threads;
  o.progress = [&bar](size_t i, size_t n, const quant::TensorPlan& t, double f) { bar.update(i, n, t, f); };
  quant::QuantizeResult r;
  try {
    r = quant::quantize_model(a.input, a.output, target, o);
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();
  size_t converted = 0;
  for (const auto& t : r.plan) converted += t.convert ? 1 : 0;
  std::printf("wrote %s (%s, %zu tensors: %zu converted, %zu copied; %s -> %s)\n", a.output.c_str(),
              target.name.c_str(), r.plan.size(), converted, r.plan.size() - converted,
              gib(r.input_bytes).c_str(), gib(r.output_bytes).c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Requantize the weight matrices of a GGUF model (2-D *.weight tensors; norms and other 1-D tensors are "
      "copied unchanged). Copies all metadata, sets general.file_type and general.quantization_version.");
  cmd->add_option("input", args->input,
                  "input .gguf file (any mix of f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)")
      ->required();
  cmd->add_option("output", args->output, "output .gguf file (written to OUTPUT.tmp, renamed when complete)")
      ->required();
  cmd->add_option(
         "type", args->type,
         "target type: " + quant::quant_target_names() +
             ". q4_k_m / q5_k_m keep the output head and attn_v / ffn_down of the first and last eighth "
             "of the layers and every third layer between at q6_k")
      ->required();
  cmd->add_option("--threads", args->threads, "quantization threads (0: one per hardware thread)");
  cmd->add_flag("-q,--quiet", args->quiet, "no progress bar");
  cmd->add_flag("--force", args->force, "replace the output file even if it is read-only");
  cmd->callback([args] {
    if (parse_only()) return;
    run_quantize(*args);
  });
}

}  // namespace tandem::cli
