// Canvas diffusion (DiffusionGemma, ../shared/GGUF-ARCH-FACTS.md section D): the contract between the model
// side and the sampler side.
//
//   model side   (src/diffusion/canvas_runner*, src/model/diffusion_gemma*): a CanvasSource runs one
//                denoising forward of a canvas over a prompt: UNIFIED ([prompt | canvas], no cache) or
//                PREFILL once + DECODE per step (prompt K/V cached in the session), self-conditioning on the
//                device (sc buffers on the output layer's device) or on the host.
//   sampler side (src/diffusion/eb_sampler*, src/diffusion/diffuse.cpp): the entropy-bound sampler (D.6)
//                with its host path and device path (D.8), and the multi-block driver (D.7).
//
// The sampler never sees phases or SC: it asks for logits of a canvas and gets a [n_vocab, C] F32 tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tandem/session.h"

namespace tandem {

class Model;

enum class Toggle { Auto, On, Off };

// The entropy-bound sampler's parameters (D.6). Defaults: GGUF diffusion.eb_* keys -> these -> flags.
struct EbParams {
  int32_t max_steps = 48;
  float t_min = 0.4f;
  float t_max = 0.8f;
  float entropy_bound = 0.1f;
  int32_t stability_threshold = 1;
  float confidence_threshold = 0.005f;
  uint32_t seed = 0;
};

// What a canvas model's GGUF says (D.1): canvas_length (required), mask token, the sampler defaults it
// stores (absent keys leave EbParams' defaults), shift_logits.
struct CanvasModelInfo {
  int32_t canvas_length = 0;
  int32_t n_vocab = 0;
  int32_t mask_token = -1;
  bool shift_logits = false;
  EbParams eb_defaults{};
};

struct CanvasOptions {
  Toggle kv_cache = Toggle::Auto;      // PREFILL once + DECODE per step (Auto: on)
  Toggle gpu_sampling = Toggle::Auto;  // self-conditioning buffers on the device (Auto: on when on a GPU)
  bool self_conditioning = true;       // SC at all (needs the self_cond_* tensors)
  int32_t max_prompt = 2048;           // prompt positions the session holds (+ canvas_length)
  KvType kv_type = KvType::F32;        // the prompt-KV store's precision (F32 as the reference keeps it)
};

// One canvas model driven step by step. Not thread-safe; one block at a time.
class CanvasSource {
 public:
  virtual ~CanvasSource() = default;
  virtual const CanvasModelInfo& info() const = 0;
  // Starts a block over `prefix` (the prompt plus the blocks kept so far). With the prompt-KV cache on this
  // runs PREFILL once; the self-conditioning state is reset (step 0 sees none).
  virtual void begin_block(std::span<const int32_t> prefix) = 0;
  // One denoising forward of the canvas (canvas_length tokens). use_sc: false on a block's first step;
  // sc_temp_inv: the previous step's 1/t. Returns the canvas logits [n_vocab, C] F32 (row i = canvas
  // position i), on a CUDA device when the device path runs, else on the host; valid until the next call.
  virtual const Tensor& forward(std::span<const int32_t> canvas, bool use_sc, float sc_temp_inv) = 0;
  // One line saying which paths run (kv cache on/off, SC device/host/off), for the log.
  virtual std::string describe() const = 0;
};

// Reads a canvas model's CanvasModelInfo (throws Error when the model is not a canvas model).
CanvasModelInfo canvas_model_info(const Model& model);

// A CanvasSource over a loaded diffusion-gemma model (any device or split the model was loaded with).
std::unique_ptr<CanvasSource> make_canvas_source(std::shared_ptr<Model> model, const CanvasOptions& options);

}  // namespace tandem
