// A model loaded from a GGUF file: its hyperparameters and weights on one device, or split over several
// (ModelParams). On the CPU the weights are views into the memory-mapped file; on a GPU they are copied into
// device memory. Sessions (session.h) run it. Loading validates every tensor's name, shape and type and
// throws tandem::Error with a message naming the problem. The file's tokenizer is built on first use
// (tokenizer()); a model whose tokenizer cannot be used still loads and runs on token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

namespace tokenizer {
class Tokenizer;  // src/tokenizer/tokenizer.h
}
struct MeshSpec;  // src/parallel/mesh.h
class Model;

struct ModelParams {
  int32_t n_threads = 0;  // CPU threads for the compute pool; 0 = all hardware threads
  // Where the weights live and the model runs without `devices`: cpu, cpu:N, cuda (= cuda:0) or cuda:N.
  std::string device = "cpu";

  // Splitting one model over several devices (src/parallel/mesh.h has the rules and the messages).
  std::string devices{};       // --devices: "cuda:0,cuda:1" or "cpu:0,cpu:1"; empty = just `device`
  std::string split_mode{};    // --split-mode: none | layer | row | tensor; empty = none
  std::string tensor_split{};  // --tensor-split: ratios per device, "3,1"; empty = equal
  int32_t main_device = 0;     // --main-device: index into devices (none runs there, row gathers there)
  bool replicate_kv = false;   // --replicate-kv: tensor split over more ranks than KV heads copies KV heads
  // The mesh the fields above describe, already built and checked by make_mesh_spec (the command line builds
  // it before it reads any file). When set, load takes it as it is and does not parse the fields again.
  std::shared_ptr<const MeshSpec> mesh{};
  // Weights this model's file lacks are taken from another loaded model (a DFlash drafter reads its target's
  // token_embd and output): the same tensors, not copies. Both models unsplit, on the same device.
  std::shared_ptr<const Model> share_weights_from{};
};

struct ModelInfo {
  std::string path;
  std::string arch;  // general.architecture: "qwen3", "llama"
  std::string name;  // general.name (may be empty)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int32_t bos_id = -1;               // tokenizer.ggml.bos_token_id, -1 if absent
  std::vector<int32_t> eos_ids;      // tokens that end generation: eos, eot, eom ids when present
  uint64_t n_params = 0;             // elements of all tensors
  uint64_t weight_bytes = 0;         // bytes of all tensors
  std::string device;                // the main device: "cpu:0 (...)"
  std::string split_mode;            // "none", "layer", "row", "tensor"
  std::vector<std::string> devices;  // every device of the mesh, rank order: "cpu:0 (...)", ...
};

// Shared ownership (Model::load returns a shared_ptr): sessions keep their model alive.
class Model : public std::enable_shared_from_this<Model> {
 public:
  // Loads and validates path. Throws tandem::Error (bad split flags, a split the model cannot take, bad file,
  // unknown architecture, missing or mis-shaped tensor).
  static std::shared_ptr<Model> load(const std::string& path, const ModelParams& params = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;

  // The tokenizer the file carries, built once on the first call (thread-safe) and kept for the model's
  // lifetime. Throws tandem::Error with the tokenizer's own message when the file has none or a broken one
  // (every call, the same message).
  const tokenizer::Tokenizer& tokenizer() const;
  // Whether tokenizer() succeeds (builds it on the first call).
  bool has_tokenizer() const;

  // Internals, for the runtime (src/model/model_impl.h).
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
