// `tandem bench --diffusion` (bench_diffusion.cpp): canvas diffusion speed, host vs device sampling path.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/kernel_profile.h"
#include "tandem/diffusion.h"
#include "tandem/model.h"

namespace tandem::cli {

// Prints the markdown table of PREFILL time, ms per step, steps/s and tokens/s for both sampling paths, and
// the bytes a step reads against bw_gbs (GB/s; 0: the fraction is not printed).
// Throws Error when model is not a canvas model (naming model_path). steps 0: the model's default. kv_type:
// CanvasOptions::kv_type (unset: auto).
// With profiler (started before the model loaded), also the per-kernel table of the denoising steps after the
// first of one more block on the faster path.
void bench_diffusion(const std::shared_ptr<Model>& model, const std::string& model_path, int n_prompt,
                     int steps, std::optional<KvType> kv_type, int reps, double bw_gbs = 0,
                     KernelProfiler* profiler = nullptr);

}  // namespace tandem::cli
