// Robustness of the chat-template interpreter (src/chat/jinja_*) under AddressSanitizer + UBSan:
// deterministic mutants of the real templates in tests/data/chat_templates (deleted, duplicated and replaced
// bytes, with the characters of Jinja syntax favoured) are parsed and rendered over a small conversation.
// Each must render or throw tandem::Error; anything else (a crash, a sanitizer report, another exception)
// fails.
//
//   chat_template_mutation_test --seed N [--mutants M] DIR
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat/jinja_eval.h"
#include "chat/jinja_parser.h"
#include "core/error.h"

namespace {

using namespace tandem::chat;

Dict variables() {
  List messages;
  const char* turns[][2] = {{"system", "Be brief."},
                            {"user", "Hi <think>x</think> é"},
                            {"assistant", "Hello."},
                            {"user", "Again?"}};
  for (const auto& t : turns) messages.emplace_back(Dict{{"role", Value(t[0])}, {"content", Value(t[1])}});
  return {{"messages", Value(messages)},
          {"add_generation_prompt", Value(true)},
          {"bos_token", Value("<s>")},
          {"eos_token", Value("</s>")}};
}

std::string mutate(const std::string& src, std::mt19937_64& rng) {
  static const std::string syntax = "{}%#-+()[]'\".|,:=~ \n";
  std::string s = src;
  const int n = 1 + int(rng() % 4);
  for (int k = 0; k < n && !s.empty(); ++k) {
    const size_t at = size_t(rng() % s.size());
    const size_t len = 1 + size_t(rng() % 8);
    switch (rng() % 4) {
      case 0:
        s.erase(at, len);
        break;
      case 1:
        s.insert(at, s.substr(at, len));
        break;
      case 2:
        s[at] = syntax[rng() % syntax.size()];
        break;
      default:
        s[at] = char(rng() % 256);
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  int mutants = 300;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--mutants" && i + 1 < argc)
      mutants = std::atoi(argv[++i]);
    else
      dir = a;
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: chat_template_mutation_test [--seed N] [--mutants M] DIR\n");
    return 2;
  }
  std::vector<std::string> sources;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jinja") {
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      sources.push_back(ss.str());
    }
  if (sources.empty()) {
    std::fprintf(stderr, "no .jinja files in %s\n", dir.c_str());
    return 2;
  }
  std::mt19937_64 rng(seed);
  const Dict vars = variables();
  int rendered = 0, rejected = 0;
  for (const auto& src : sources) {
    for (int m = 0; m < mutants; ++m) {
      const std::string text = m == 0 ? src : mutate(src, rng);
      try {
        const Body body = parse_template(text);
        check_supported(body);
        render_template(body, vars);
        ++rendered;
      } catch (const tandem::Error&) {
        ++rejected;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "FAIL: a mutant threw a non-tandem exception: %s\n--- template ---\n%s\n",
                     e.what(), text.c_str());
        return 1;
      }
    }
  }
  std::printf("PASS: %zu templates x %d mutants: %d rendered, %d rejected with tandem::Error\n",
              sources.size(), mutants, rendered, rejected);
  return 0;
}
