// The `tandem` command line: one binary, one subcommand per job (see commands.h).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: run large language models from GGUF files on the CPU and NVIDIA GPUs"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION + " (" + TANDEM_GIT_COMMIT + ")");
  app.require_subcommand(1);

  tandem::cli::add_inspect_command(app);
  tandem::cli::add_convert_command(app);
  tandem::cli::add_quantize_command(app);
  tandem::cli::add_generate_command(app);
  tandem::cli::add_tokenize_command(app);
  tandem::cli::add_bench_command(app);
  tandem::cli::add_perplexity_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
