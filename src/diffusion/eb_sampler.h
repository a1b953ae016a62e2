// The entropy-bound (EB) sampler of canvas diffusion (../shared/GGUF-ARCH-FACTS.md D.6), in three parts:
//   - EbRandom: the step's randomness in D.6's exact draw order (std::mt19937 and libstdc++'s distributions);
//   - eb_decide: the pure decision of one step from per-row (argmax, entropy, sample) triples and the renoise
//     draws: acceptance by ascending entropy under the strict prefix bound, renoise, display canvas, stop
//     rule;
//   - run_eb_block: the loop over a CanvasSource (forward, reduce on the host or the logits' device, decide).
// The per-row reduction itself is Ops::diffusion_sample_rows (eb_reduce.h).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "tandem/diffusion.h"

namespace tandem::diffusion {

struct EbRowStats {
  int32_t argmax = 0;   // first index of the maximum of the row
  float entropy = 0;    // natural-log entropy of softmax(row * inv_temp)
  int32_t sampled = 0;  // inverse-CDF sample of that softmax at the step's uniform
};

// t = t_min + (t_max - t_min) * cur_step / S for cur_step = S .. 1 (so the last step is not exactly t_min),
// computed in double from the float parameters and rounded once.
float eb_temperature(const EbParams& p, int32_t cur_step);

// std::mt19937 seeded with the seed; the canvas is drawn first (uniform ids in position order), then per step
// and per position: u = uniform_real_distribution<float>(0, 1), then renoise = uniform_int(0, n_vocab - 1).
class EbRandom {
 public:
  EbRandom(uint32_t seed, int32_t n_vocab);
  std::vector<int32_t> initial_canvas(int32_t canvas_length);
  void draw_step(std::span<float> u, std::span<int32_t> renoise);

 private:
  std::mt19937 gen_;
  std::uniform_int_distribution<int32_t> token_;
  std::uniform_real_distribution<float> unit_;
};

// The outcome of one step (eb_decide).
struct EbDecision {
  std::vector<int32_t> next_canvas;  // accepted: the sample; else: the renoise draw
  std::vector<int32_t> argmax;       // the display canvas
  std::vector<uint8_t> accepted;
  int32_t n_accepted = 0;
  double mean_entropy = 0;
  int32_t held = 0;  // consecutive steps whose argmax canvas equalled the previous one
  bool stable = false, confident = false, stop = false;
};

// One step's decision. rows and renoise have one entry per canvas position; prev_argmax is the previous
// step's display canvas (all -1 before the first step) and held its stability counter. Acceptance: positions
// sorted by ascending entropy (ties: lower position first, a deterministic choice where D.6's std::sort
// leaves the order unspecified), walking that order with the sum of the entropies strictly before each
// position in double: accepted while that sum <= entropy_bound (so the lowest-entropy position always is).
// Stop: held >= stability_threshold and mean entropy < confidence_threshold.
EbDecision eb_decide(std::span<const EbRowStats> rows, std::span<const int32_t> renoise,
                     std::span<const int32_t> prev_argmax, int32_t held, const EbParams& p);

class EbReducer;

// One block's EB loop over source (begin_block already called). Returns the display canvas of the last step;
// steps and whether the stop rule ended it go to stats. on_step may stop the loop.
struct EbBlockRun {
  std::vector<int32_t> canvas;
  int32_t steps = 0;
  bool converged = false;
  bool device_reduce = false;
};
EbBlockRun run_eb_block(CanvasSource& source, EbReducer& reducer, const EbParams& p, int32_t block,
                        const DiffusionStepCallback& on_step);

}  // namespace tandem::diffusion
