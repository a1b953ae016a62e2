// libFuzzer harness for the command-line parser: the input is split at NUL bytes into argv words and parsed
// by the real `tandem` app (every subcommand and option, tools/tandem/*.cpp, with CLI11's validators) with
// the commands' actions skipped (cli::parse_only), so no model is read and nothing is written. Each parse
// either succeeds or fails with CLI11's ParseError or tandem::Error; anything else (another exception, a
// sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../tools/tandem/commands.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"tandem"};
  std::string cur;
  for (size_t i = 0; i < size && words.size() < 64; ++i) {
    if (data[i] == 0) {
      words.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(data[i]));
    }
  }
  if (!cur.empty()) words.push_back(cur);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());

  CLI::App app{"tandem"};
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  tandem::cli::add_all_commands(app);
  tandem::cli::parse_only() = true;
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
  } catch (const tandem::Error&) {
  }
  return 0;
}
