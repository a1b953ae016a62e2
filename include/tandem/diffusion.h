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
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tandem/session.h"

namespace tandem {

class Model;
class Device;

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

// Throws Error naming the field when a parameter is out of range (max_steps >= 1, 0 <= t_min < t_max finite,
// entropy_bound > 0, stability_threshold >= 0, confidence_threshold > 0).
void check_eb_params(const EbParams& p);

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
  // The K/V store's precision. Unset (auto): F32 (as the reference keeps it); with TANDEM_CANVAS_KV_F16=1 (off
  // until measured on a GPU), F16 when the model runs on a GPU with weights that are not F32, so that the
  // canvas rows' attention runs on tensor cores.
  std::optional<KvType> kv_type;
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
  // Replaces the previous step's logits that the next forward()'s self-conditioning reads (C rows of n_vocab,
  // raw: forward() applies sc_temp_inv): reference checks give every step the reference's own previous
  // logits, so that each step is compared alone (errors of a chain of steps grow with max|logit| * 1/t per
  // step). Throws Error when the sizes differ or the source has no self-conditioning.
  virtual void set_sc_logits(std::span<const float> logits);
  // (sampler side, added) The Device that holds forward()'s logits when they are not host memory; nullptr
  // when they are on the host. forward() returns with the logits ordered before any work the caller then
  // enqueues on that device's default_stream(). The sampler reduces them there (Ops::diffusion_sample_rows)
  // or copies them to the host. GPU logits with no Device named here are read after a device-wide
  // synchronize (slow; one log line).
  virtual Device* logits_device() const { return nullptr; }
};

// Reads a canvas model's CanvasModelInfo (throws Error when the model is not a canvas model).
CanvasModelInfo canvas_model_info(const Model& model);

// A CanvasSource over a loaded diffusion-gemma model (any device or split the model was loaded with).
std::unique_ptr<CanvasSource> make_canvas_source(std::shared_ptr<Model> model, const CanvasOptions& options);

// ---- the sampler side: the EB loop (D.6) and the multi-block driver (D.7), src/diffusion/ ----------------

// What one denoising step decided, for progress lines, --visual and tests. The spans are valid during the
// callback only.
struct DiffusionStep {
  int32_t block = 0;      // block index
  int32_t step = 0;       // 0-based step of the block (step_idx of D.6)
  int32_t max_steps = 0;  // EbParams::max_steps
  float temperature = 0;
  int32_t n_accepted = 0;
  double mean_entropy = 0;
  bool stable = false, confident = false;  // the stop rule's two halves (stop = both)
  bool device_reduce = false;              // the per-row reduction ran on the logits' device
  std::span<const int32_t> canvas;         // this step's input canvas
  std::span<const int32_t> argmax;         // the display canvas: argmax per position
  std::span<const float> entropy;          // per position, of softmax(logits / t)
  std::span<const int32_t> sampled;        // per position, the inverse-CDF sample at u
  std::span<const float> u;                // the step's draws (D.6 e), for traces and reference checks
  std::span<const int32_t> renoise;
  std::span<const uint8_t> accepted;     // 1 where the position took its sample
  std::span<const int32_t> next_canvas;  // the input of the next step (accepted samples + renoise)
  int32_t held = 0;                      // the stability counter after this step
};
// Called after every step; returning false stops the block's loop (its display canvas is kept).
using DiffusionStepCallback = std::function<bool(const DiffusionStep&)>;

struct DiffusionParams {
  EbParams eb{};
  int32_t n_predict = 256;  // tokens wanted: blocks = ceil(n_predict / canvas_length)
  int32_t n_blocks = 0;     // > 0: exactly this many blocks at most (--diffusion-blocks)
  // The per-row reduction on the logits' device (D.8): Auto = when the logits are on a GPU; On = whenever the
  // source names a logits device (a one-line note and the host path otherwise); Off = on the host.
  Toggle gpu_sample_reduce = Toggle::Auto;
  std::vector<int32_t> eog_ids;  // a block is cut at the first of these
  int32_t repeat_run = 6;        // a block is cut where a unit of 1 or 2 tokens repeats this often (0 = off)
  // > 0: the longest prefix (prompt + kept blocks) a block may start over (CanvasOptions::max_prompt of the
  // source). A longer prompt is an Error; a later block that would exceed it ends the response (D.7).
  int32_t max_prefix = 0;
  std::function<void(const std::string&)> log;  // one-line notes (soft fallbacks); null: stderr
};

struct DiffusionBlockStats {
  int32_t steps = 0;           // denoising steps run
  bool converged = false;      // the stop rule ended it (not max_steps or the callback)
  int32_t kept = 0;            // tokens appended to the response
  bool trimmed = false;        // cut before canvas_length (EOG or a loop): the last block
  double begin_seconds = 0;    // begin_block (PREFILL)
  double denoise_seconds = 0;  // all steps (forward + reduction + decisions)
};

struct DiffusionResult {
  std::vector<int32_t> tokens;  // the response (trimmed blocks, in order)
  std::vector<DiffusionBlockStats> blocks;
  int32_t total_steps = 0;
  bool device_reduce = false;  // at least one step reduced on the device
};

// Runs blocks over prompt (already chat-formatted and tokenized): each block begins over prefix = prompt +
// the blocks kept so far, runs the EB loop with the same seed, is cut at the first EOG token or a loop, and
// ends the response when cut. Throws Error for bad parameters or a source that breaks its contract.
DiffusionResult diffuse(CanvasSource& source, std::span<const int32_t> prompt, const DiffusionParams& params,
                        const DiffusionStepCallback& on_step = {});

// The length of canvas that is kept (D.7): up to the first EOG token, and up to the first unit of 1 or 2
// tokens that repeats repeat_run times in a row (one copy of the unit is kept). repeat_run 0: no loop cut.
size_t diffusion_keep_length(std::span<const int32_t> canvas, std::span<const int32_t> eog_ids,
                             int32_t repeat_run);

}  // namespace tandem
