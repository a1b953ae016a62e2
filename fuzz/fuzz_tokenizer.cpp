// libFuzzer harness for the tokenizer: random bytes -> encode -> decode, on the shipped model's byte-level
// BPE vocabulary (and the draft model's, the same tokenizer) with special-token parsing on and off. Every
// input must encode without error, every id must be in the vocabulary, and decoding must give the input back
// exactly (byte-level BPE covers every byte; with parse_special the special-token text decodes to itself when
// rendered).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

const tandem::tokenizer::Tokenizer& shipped_tokenizer() {
  static std::unique_ptr<tandem::tokenizer::Tokenizer> tok = [] {
    const std::string path = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
    const tandem::gguf::GgufFile f = tandem::gguf::GgufFile::open(path);
    return std::make_unique<tandem::tokenizer::Tokenizer>(tandem::tokenizer::Tokenizer::from_gguf(f));
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = shipped_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, parse_special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.n_vocab()) std::abort();  // an id outside the vocabulary
    const std::string back = tok.decode(ids, /*render_special=*/parse_special);
    if (back != text) {
      std::fprintf(stderr, "round trip failed (parse_special=%d): %zu bytes in, %zu out\n",
                   int(parse_special), text.size(), back.size());
      std::abort();
    }
  }
  return 0;
}
