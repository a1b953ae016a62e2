// What a tandem::Model holds: the mapped GGUF file, the device the weights live on, and the architecture.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/decoder.h"
#include "tandem/model.h"

namespace tandem {

struct Model::Impl {
  std::unique_ptr<gguf::GgufFile> file;  // first: the weights point into its mapping
  std::unique_ptr<Device> device;
  std::unique_ptr<DecoderModel> decoder;
  ModelInfo info;
};

}  // namespace tandem
