// `tandem tokenize -m FILE.gguf (-p TEXT | -f FILE) [--ids] [--no-bos] [--parse-special] [--lines]
// [--stats]`: the token ids (and pieces) of a text, with the vocabulary of a GGUF file. Vocab-only files
// work.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/file_io.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string prompt;
  std::string file;
  bool ids_only = false;
  bool no_bos = false;
  bool parse_special = false;
  bool lines = false;
  bool roundtrip = false;
  bool stats = false;
  bool has_prompt = false, has_file = false;
};

std::string read_input(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return read_regular_file(path, "input file");
}

// A piece as printable text: control bytes and bytes that are not valid UTF-8 are escaped.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\\')
      out += "\\\\";
    else if (c == '\'')
      out += "\\'";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<int32_t> tokenize_one(const tokenizer::Tokenizer& tok, std::string_view text,
                                  const TokenizeArgs& a) {
  std::vector<int32_t> ids;
  if (!a.no_bos && tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
  const auto body = tok.encode(text, /*add_special=*/false, a.parse_special);
  ids.insert(ids.end(), body.begin(), body.end());
  if (tok.add_eos() && tok.eos() >= 0) ids.push_back(tok.eos());
  return ids;
}

void run_tokenize(const TokenizeArgs& a) {
  check(a.has_prompt != a.has_file, "give the text with exactly one of -p TEXT or -f FILE");
  check(!a.roundtrip || a.lines, "--roundtrip needs --lines");
  const std::string text = a.has_file ? read_input(a.file) : a.prompt;
  const gguf::GgufFile file = gguf::GgufFile::open(a.model);
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);

  if (a.lines) {
    // One line of space-separated ids per input line (the '\n' is not part of the line). With --roundtrip, a
    // tab and 1 or 0 follow: whether decoding the ids (without BOS/EOS) gives the line back.
    std::string out;
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      const std::string_view line(text.data() + begin, end - begin);
      const auto ids = tokenize_one(tok, line, a);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
      }
      if (a.roundtrip) {
        const auto body = tok.encode(line, false, a.parse_special);
        out += tok.decode(body, /*render_special=*/true) == line ? "\t1" : "\t0";
      }
      out += '\n';
      begin = end + 1;
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
  }

  // Wall time, and the CPU time of this thread (what one core spends, even on a busy machine).
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  const auto ids = tokenize_one(tok, text, a);
  const double cpu = thread_cpu_seconds() - cpu0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.stats) {
    std::printf("%zu bytes -> %zu tokens in %.3f s wall, %.3f s CPU (%.2f MB/s of CPU time, one thread)\n",
                text.size(), ids.size(), secs, cpu, text.size() / 1e6 / cpu);
    return;
  }
  if (a.ids_only) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
  }
  for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, printable(tok.token_to_piece(id)).c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize",
                                     "Print the token ids (and pieces) of a text with a GGUF's vocabulary "
                                     "(a vocab-only GGUF is enough).");
  cmd->add_option("-m,--model", args->model, "GGUF file with tokenizer.ggml.* metadata")->required();
  CLI::Option* prompt = cmd->add_option("-p,--prompt", args->prompt, "text to tokenize");
  CLI::Option* file = cmd->add_option("-f,--file", args->file, "file to tokenize (- for standard input)");
  cmd->add_flag("--ids", args->ids_only, "print only the ids, as [a, b, c]");
  cmd->add_flag("--no-bos", args->no_bos, "do not add the BOS token even if the vocabulary asks for it");
  cmd->add_flag("--parse-special", args->parse_special,
                "recognise special-token text such as <|im_start|> as those tokens (off: it is plain text)");
  cmd->add_flag("--lines", args->lines,
                "tokenize each line of the input on its own; print one line of ids per line");
  cmd->add_flag("--roundtrip", args->roundtrip,
                "with --lines: append a tab and 1 if decode(encode(line)) == line");
  cmd->add_flag("--stats", args->stats, "print only the token count and the time taken");
  cmd->callback([args, prompt, file] {
    if (parse_only()) return;
    args->has_prompt = prompt->count() > 0;
    args->has_file = file->count() > 0;
    run_tokenize(*args);
  });
}

}  // namespace tandem::cli
