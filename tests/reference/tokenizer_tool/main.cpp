// tandem_tokenizer_tool: `tokenize` (the same command as `tandem tokenize`) and `convert-vocab HF_DIR -o
// OUT.gguf` (the tokenizer path of `tandem convert --vocab-only`), for tokenizer_parity.py.
#include <cstdio>
#include <string>

#include "commands.h"
#include "convert/tokenizer_to_gguf.h"
#include "core/error.h"
#include "gguf/gguf.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem tokenizer tool"};
  app.require_subcommand(1);
  tandem::cli::add_tokenize_command(app);
  std::string hf_dir, out;
  CLI::App* conv = app.add_subcommand("convert-vocab", "tokenizer.json -> vocab-only GGUF");
  conv->add_option("hf_dir", hf_dir)->required();
  conv->add_option("-o,--output", out)->required();
  conv->callback([&] {
    tandem::gguf::GgufWriter w;
    w.set("general.architecture", tandem::gguf::Value::string("llama"));
    tandem::convert::add_tokenizer_metadata(hf_dir, w);
    w.write(out);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
