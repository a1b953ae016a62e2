// Loader of the `qwen3` architecture.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

std::unique_ptr<DecoderModel> load_qwen3(const gguf::GgufFile& file, DeviceId device);

}  // namespace tandem
