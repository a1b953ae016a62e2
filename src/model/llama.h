// The `llama` architecture: hyperparameters and loader.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

ModelHparams llama_hparams(const gguf::GgufFile& file);
std::unique_ptr<DecoderModel> load_llama(const gguf::GgufFile& file, const ModelHparams& hp,
                                         const DecoderLoadContext& ctx);

}  // namespace tandem
