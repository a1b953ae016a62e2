// Placeholder until the diffusion-gemma model lands (issue 17): the factory refuses clearly.
#include "core/error.h"
#include "tandem/diffusion.h"
#include "tandem/model.h"

namespace tandem {

CanvasModelInfo canvas_model_info(const Model&) {
  throw Error("canvas diffusion models (diffusion-gemma) are not supported yet");
}

std::unique_ptr<CanvasSource> make_canvas_source(std::shared_ptr<Model>, const CanvasOptions&) {
  throw Error("canvas diffusion models (diffusion-gemma) are not supported yet");
}

}  // namespace tandem
