// The `gemma4` architecture (GGUF-ARCH-FACTS C): hyperparameters, loader and shard rules.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

ModelHparams gemma4_hparams(const gguf::GgufFile& file);
std::unique_ptr<DecoderModel> load_gemma4(const gguf::GgufFile& file, const ModelHparams& hp,
                                          const DecoderLoadContext& ctx);
// The shard rules of gemma4's tensors (gemma4_rules.cpp).
ShardRuleTable gemma4_shard_rules();

}  // namespace tandem
