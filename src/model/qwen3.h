// The `qwen3` architecture: hyperparameters and loader.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

ModelHparams qwen3_hparams(const gguf::GgufFile& file);
std::unique_ptr<DecoderModel> load_qwen3(const gguf::GgufFile& file, const ModelHparams& hp,
                                         const DecoderLoadContext& ctx);

}  // namespace tandem
