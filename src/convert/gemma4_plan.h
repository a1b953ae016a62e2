// Which GGUF tensors a converted Gemma 4 checkpoint has, their HF sources and GGUF shapes
// (../shared/GGUF-ARCH-FACTS.md C.2, C.7). Norms are copied as they are (Gemma 4 norms are plain: no +1,
// C.6).
#pragma once

#include <vector>

#include "convert/gemma4_config.h"
#include "convert/tensor_plan.h"

namespace tandem::convert {

// n_vocab_gguf: token_embd (and per_layer_token_embd) rows kept, the tokenizer's token count (llama.cpp trims
// the embedding rows to it). Order: rope_freqs (generated), token_embd, per-layer-input globals, blocks,
// output_norm, output (only when the embeddings are not tied).
std::vector<PlannedTensor> plan_gemma4_tensors(const Gemma4Hparams& hp, int64_t n_vocab_gguf);

}  // namespace tandem::convert
