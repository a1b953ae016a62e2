// Architecture name -> loader. Adding an architecture: one loader function and one line here.
#include <string>

#include "core/error.h"
#include "model/decoder.h"
#include "model/llama.h"
#include "model/qwen3.h"

namespace tandem {

namespace {

struct ArchEntry {
  const char* name;
  std::unique_ptr<DecoderModel> (*load)(const gguf::GgufFile&, DeviceId);
};

constexpr ArchEntry kArchitectures[] = {
    {"llama", load_llama},
    {"qwen3", load_qwen3},
};

}  // namespace

std::string supported_architectures() {
  std::string s;
  for (const ArchEntry& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, DeviceId device) {
  const std::string arch = file.architecture();
  check(!arch.empty(), file.path() + ": no general.architecture key; is this a model file?");
  for (const ArchEntry& a : kArchitectures)
    if (arch == a.name) return a.load(file, device);
  throw Error(file.path() + ": unknown architecture '" + arch + "'; supported: " + supported_architectures());
}

}  // namespace tandem
