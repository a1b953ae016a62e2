// Each subcommand of the `tandem` binary lives in its own cmd_<name>.cpp and registers itself here.
// A command's run function throws tandem::Error for bad input; main() prints it on one line and exits 1.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_inspect_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_parallel_command(CLI::App& app);

}  // namespace tandem::cli
