// The flags that split one model over several devices (src/parallel/mesh.h), shared by every command that
// loads a model to run it (generate, perplexity, bench), so that they are spelled, documented and checked in
// one place.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "parallel/mesh.h"
#include "tandem/model.h"

namespace tandem::cli {

struct SplitOptions {
  std::string devices;              // --devices
  std::string split_mode = "none";  // --split-mode
  std::string tensor_split;         // --tensor-split
  int main_device = 0;              // --main-device
  bool replicate_kv = false;        // --replicate-kv
};

// Registers --devices, --split-mode, --tensor-split, --main-device and --replicate-kv on cmd, storing into o
// (which must outlive the parse).
void add_split_options(CLI::App* cmd, SplitOptions* o);

// Copies the flags into mp and builds the mesh from them with make_mesh_spec (mp.device is the device used
// without --devices); mp.mesh carries it to Model::load, which does not parse the flags again. Throws
// tandem::Error naming the flag for bad values, so call it before reading any file. Returns the checked mesh.
MeshSpec apply(const SplitOptions& o, ModelParams& mp);

}  // namespace tandem::cli
