// Each subcommand of the `tandem` binary lives in its own cmd_<name>.cpp and registers itself here.
// A command's run function throws tandem::Error for bad input; main() prints it on one line and exits 1.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

// True in the command-line fuzzer (fuzz/fuzz_cli_flags.cpp): flags are parsed and validated by CLI11, and the
// commands' actions are skipped (nothing is read or written).
inline bool& parse_only() {
  static bool value = false;
  return value;
}

void add_inspect_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_parallel_command(CLI::App& app);
void add_diffuse_command(CLI::App& app);

// Every subcommand, in the order `tandem --help` lists them: the binary and the command-line fuzzer register
// the same set from here, so a new command is fuzzed as soon as it exists.
inline void add_all_commands(CLI::App& app) {
  add_inspect_command(app);
  add_convert_command(app);
  add_quantize_command(app);
  add_generate_command(app);
  add_tokenize_command(app);
  add_bench_command(app);
  add_perplexity_command(app);
  add_chat_command(app);
  add_serve_command(app);
  add_parallel_command(app);
  add_diffuse_command(app);
}

}  // namespace tandem::cli
