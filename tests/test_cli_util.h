// Runs the `tandem` binary (TANDEM_BIN, a compile definition of the test target) or any shell command from a
// test and returns its exit code and output, for the end-to-end tests of the subcommands.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tandem::test {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not be started or did not exit normally
  std::string out;     // stdout, with stderr merged in unless discarded
};

enum class Stderr { Merge, Discard };

inline CommandResult run_command(const std::string& cmd, Stderr err = Stderr::Merge) {
  const std::string full = cmd + (err == Stderr::Merge ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(full.c_str(), "r");
  CommandResult r;
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `tandem <args>`; args is shell text (quote paths).
inline CommandResult run_tandem(const std::string& args, Stderr err = Stderr::Merge) {
  return run_command(std::string(TANDEM_BIN) + " " + args, err);
}

}  // namespace tandem::test
