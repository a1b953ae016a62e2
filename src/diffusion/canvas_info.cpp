// canvas_model_info: what a diffusion-gemma GGUF says about its canvas (GGUF-ARCH-FACTS D.1): canvas_length
// (required > 0), the mask token, shift_logits, and the sampler defaults diffusion.eb_* (absent keys keep
// EbParams' defaults).
#include <cmath>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model_impl.h"
#include "tandem/diffusion.h"

namespace tandem {

CanvasModelInfo canvas_model_info(const Model& model) {
  const gguf::GgufFile& f = *model.impl().file;
  const std::string arch = f.architecture();
  check(arch == "diffusion-gemma", f.path() + " is not a canvas diffusion model: its architecture is '" + arch +
                                       "' (canvas diffusion needs a diffusion-gemma model)");
  CanvasModelInfo info;
  check(f.find("diffusion.canvas_length") != nullptr,
        f.path() + ": GGUF key diffusion.canvas_length is missing (a canvas model needs it)");
  const int64_t C = f.get_int("diffusion.canvas_length");
  check(C > 0 && C <= 65536, f.path() + ": GGUF key diffusion.canvas_length must be in [1, 65536], got " +
                                 std::to_string(C));
  info.canvas_length = int32_t(C);
  info.n_vocab = int32_t(model.impl().decoder().hparams().n_vocab);
  check(f.find("tokenizer.ggml.mask_token_id") != nullptr,
        f.path() + ": GGUF key tokenizer.ggml.mask_token_id is missing (the canvas starts as mask tokens)");
  const int64_t mask = f.get_int("tokenizer.ggml.mask_token_id");
  check(mask >= 0 && mask < info.n_vocab, f.path() + ": tokenizer.ggml.mask_token_id " + std::to_string(mask) +
                                              " is outside the vocabulary of " + std::to_string(info.n_vocab));
  info.mask_token = int32_t(mask);
  info.shift_logits = f.get_bool("diffusion.shift_logits", false);
  EbParams& eb = info.eb_defaults;
  auto pos_int = [&](const char* key, int32_t& dst) {
    if (!f.find(key)) return;
    const int64_t v = f.get_int(key);
    check(v >= 1 && v <= 1000000, f.path() + ": GGUF key " + key + " must be >= 1, got " + std::to_string(v));
    dst = int32_t(v);
  };
  auto flt = [&](const char* key, float& dst) {
    if (!f.find(key)) return;
    const double v = f.get_float(key);
    check(std::isfinite(v) && v >= 0.0, f.path() + ": GGUF key " + key + " must be finite and >= 0");
    dst = float(v);
  };
  pos_int("diffusion.eb_max_steps", eb.max_steps);
  flt("diffusion.eb_t_min", eb.t_min);
  flt("diffusion.eb_t_max", eb.t_max);
  flt("diffusion.eb_entropy_bound", eb.entropy_bound);
  pos_int("diffusion.eb_stability_threshold", eb.stability_threshold);
  flt("diffusion.eb_confidence_threshold", eb.confidence_threshold);
  return info;
}

}  // namespace tandem
