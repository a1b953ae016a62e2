// Where the small model that ships with tandem (models/, see models/README.md) is found when a command gets
// no -m: `tandem generate` and `tandem perplexity` then use it, so a first run needs no download.
#pragma once

#include <string>
#include <vector>

namespace tandem::eval {

// File name of the shipped main model (Qwen3 architecture, Q8_0) and of its draft model.
inline constexpr const char* kDefaultModelFile = "tandem-small-q8_0.gguf";
// The canvas-diffusion model `tandem diffuse` runs without -m (models/README.md).
inline constexpr const char* kDefaultDiffusionModelFile = "tandem-diffusion-q8_0.gguf";
inline constexpr const char* kDefaultDraftFile = "tandem-draft-q8_0.gguf";

// The places searched, in order: $TANDEM_MODEL (a file path, when set: then it must exist);
// <source_dir>/models/<file> (the checkout the binary was built from); <dir of the running
// binary>/../share/tandem/models/<file> (an installed tree); <dir of the running binary>/../../models/<file>
// (a build folder inside the checkout).
std::vector<std::string> default_model_candidates(const std::string& source_dir,
                                                  const char* file = kDefaultModelFile);

// The first candidate that exists. Throws tandem::Error listing the places tried, with a hint to pass -m.
std::string default_model_path(const std::string& source_dir, const char* file = kDefaultModelFile);

}  // namespace tandem::eval
