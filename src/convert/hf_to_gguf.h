// `tandem convert`: a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json) -> one
// GGUF file with the metadata keys, tensor names, shapes and layouts that llama.cpp's converter writes
// (../shared/GGUF-ARCH-FACTS.md B). Supported: LlamaForCausalLM (arch llama), Qwen3ForCausalLM (arch qwen3),
// Gemma 4, and z-lab DFlash drafters (DFlashDraftModel -> arch dflash, with --target-model-dir; E.1).
//
// Tensors are produced one at a time while the file is written (read from the mmapped safetensors, permuted,
// converted or quantized), so a checkpoint larger than RAM converts. Everything that can be checked is
// checked before the output is created (config, every expected tensor's presence, shape and dtype), and the
// writer writes "<out>.tmp" and renames it at the end, so a failure never leaves a partial output file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "convert/output_type.h"

namespace tandem::convert {

struct ConvertOptions {
  std::filesystem::path hf_dir;
  std::filesystem::path output;
  OutType type = OutType::AUTO;  // AUTO: bf16 when the checkpoint is bf16, else f16
  int threads = 0;               // quantization threads; <= 0: one per hardware thread
  bool vocab_only = false;       // only the tokenizer (plus general.architecture, general.name), no tensors
  std::string name;              // general.name; empty: the checkpoint directory's name
  // DFlash drafters (DFlashDraftModel): the target model's HF directory, whose tokenizer (and config.json,
  // for the vocabulary size and the hidden-size check) the drafter file gets. Required for them only.
  std::filesystem::path target_model_dir;
  // Receives progress lines and notes (ignored tensors, type fallbacks); may be empty.
  std::function<void(const std::string&)> log;
};

struct ConvertResult {
  std::string arch;              // "qwen3", "llama"
  OutType type = OutType::AUTO;  // the resolved --type
  size_t n_tensors = 0;
  std::vector<std::string> notes;  // also sent to log
};

ConvertResult convert_hf_to_gguf(const ConvertOptions& options);

}  // namespace tandem::convert
