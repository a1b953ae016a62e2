// tandem::Model: loads a GGUF file onto a device and keeps everything the sessions need.
#include <set>

#include "core/error.h"
#include "model/model_impl.h"

namespace tandem {

namespace {

int32_t token_id_key(const gguf::GgufFile& f, const char* key, int64_t n_vocab) {
  const gguf::Value* v = f.find(key);
  if (!v || !v->is_integer()) return -1;
  const int64_t id = v->as_int();
  return id >= 0 && id < n_vocab ? int32_t(id) : -1;
}

// "cpu", "cpu:N", "cuda", "cuda:N".
DeviceId parse_model_device(const std::string& s) {
  const bool cpu = s.rfind("cpu", 0) == 0, cuda = s.rfind("cuda", 0) == 0;
  const size_t n = cpu ? 3 : 4;
  check((cpu || cuda) && (s.size() == n || (s[n] == ':' && s.size() > n + 1 &&
                                            s.find_first_not_of("0123456789", n + 1) == std::string::npos)),
        "device '" + s + "': expected cpu, cpu:N, cuda or cuda:N");
  const int index = s.size() > n ? std::stoi(s.substr(n + 1)) : 0;
  return DeviceId{cpu ? DeviceKind::CPU : DeviceKind::CUDA, index};
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelInfo& Model::info() const {
  return impl_->info;
}

std::shared_ptr<Model> Model::load(const std::string& path, const ModelParams& params) {
  check(params.n_threads >= 0, "the number of threads must be >= 0 (0 = all hardware threads)");
  auto impl = std::make_unique<Impl>();
  impl->file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path));
  DeviceOptions options;
  options.n_threads = params.n_threads;
  impl->device = create_device(parse_model_device(params.device), options);
  impl->decoder = load_decoder_model(*impl->file, impl->device->id());

  const gguf::GgufFile& f = *impl->file;
  const ModelHparams& hp = impl->decoder->hparams();
  ModelInfo& info = impl->info;
  info.path = path;
  info.arch = hp.arch;
  info.name = hp.name;
  info.n_vocab = hp.n_vocab;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_embd = hp.n_embd;
  info.n_layer = hp.n_layer;
  info.n_head = hp.n_head;
  info.n_head_kv = hp.n_head_kv;
  info.head_dim = hp.head_dim_k;
  info.n_ff = hp.n_ff;
  info.bos_id = token_id_key(f, "tokenizer.ggml.bos_token_id", hp.n_vocab);
  std::set<int32_t> eos;
  for (const char* key :
       {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = token_id_key(f, key, hp.n_vocab);
    if (id >= 0) eos.insert(id);
  }
  info.eos_ids.assign(eos.begin(), eos.end());
  for (const gguf::TensorInfo& t : f.tensors()) {
    info.n_params += uint64_t(t.nelements());
    info.weight_bytes += t.nbytes;
  }
  info.device = impl->device->name();
  return std::shared_ptr<Model>(new Model(std::move(impl)));
}

}  // namespace tandem
