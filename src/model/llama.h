// Loader of the `llama` architecture.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

std::unique_ptr<DecoderModel> load_llama(const gguf::GgufFile& file, DeviceId device);

}  // namespace tandem
