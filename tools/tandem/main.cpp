// The `tandem` command line: one binary, one subcommand per job (see commands.h).
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "parallel/process_world.h"

namespace {

// Under mpirun every process runs the same command (process_world.h) and computes the same output: rank 0
// prints it. The others keep stderr, so an error on any rank is seen.
// Rank 0's stdout reaches the terminal through the launcher, and Open MPI 5's forwarding loses pieces of a
// line written in several writes (Debian 13's 5.0.7: of a streamed answer only its last token arrived, one
// run in three): there stdout goes out whole lines at a time (line buffered, with a buffer larger than any
// line generate streams; generate skips its per-token flush under a launcher).
void quiet_unless_first_process() {
  const tandem::ProcessWorld w = tandem::launcher_world();
  if (w.rank > 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    std::fprintf(stderr, "tandem: warning: could not silence stdout of this process\n");
  if (w.rank == 0 && w.size > 1) std::setvbuf(stdout, nullptr, _IOLBF, size_t(1) << 20);
}

// An error on one process of an MPI job ends the job: the other processes would wait in a collective forever.
int fail(const char* what) {
  std::fprintf(stderr, "error: %s\n", what);
  tandem::abort_process_world(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  quiet_unless_first_process();
  CLI::App app{"tandem: run large language models from GGUF files on the CPU and NVIDIA GPUs"};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION + " (" + TANDEM_GIT_COMMIT + ")");
  app.require_subcommand(1);

  tandem::cli::add_all_commands(app);

  // An unknown first word is a mistyped command: name it and list the commands (CLI11 would only say that a
  // subcommand is required).
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string word = argv[1];
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      known |= sub->get_name() == word;
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s'; the commands are: %s (tandem --help)\n",
                   word.c_str(), names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
