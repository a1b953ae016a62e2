// Hugging Face tokenizer.json (+ tokenizer_config.json) -> the `tokenizer.ggml.*` GGUF keys that llama.cpp
// writes (model, pre, tokens, token_type, merges or scores, special token ids, add_bos/add_eos, chat_template).
// Used by `tandem convert` for whole checkpoints and for vocab-only files.
#pragma once

#include <filesystem>

#include "gguf/gguf.h"

namespace tandem::convert {

// Reads hf_dir/tokenizer.json and, when present, hf_dir/tokenizer_config.json (and generation_config.json for
// default special tokens), and sets the tokenizer.ggml.* keys on w. Throws tandem::Error when tokenizer.json is
// missing, unreadable, or of a kind tandem does not support (the message says which).
void add_tokenizer_metadata(const std::filesystem::path& hf_dir, gguf::GgufWriter& w);

}  // namespace tandem::convert
