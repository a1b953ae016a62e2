// tandem::Model: checks the mesh and the split against the model's dimensions (before any weight is read),
// creates the devices, and loads one decoder per rank.
#include <set>
#include <thread>

#include "core/error.h"
#include "model/model_impl.h"
#include "parallel/process_world.h"

namespace tandem {

namespace {

int32_t token_id_key(const gguf::GgufFile& f, const char* key, int64_t n_vocab) {
  const gguf::Value* v = f.find(key);
  if (!v || !v->is_integer()) return -1;
  const int64_t id = v->as_int();
  return id >= 0 && id < n_vocab ? int32_t(id) : -1;
}

// Layer split without --tensor-split on GPUs: layers in proportion to each device's free memory.
void ratios_by_free_memory(MeshSpec& mesh, const std::vector<std::unique_ptr<Device>>& devices) {
  if (mesh.mode != SplitMode::Layer || mesh.ratios_given || devices.front()->id().kind == DeviceKind::CPU)
    return;
  double total = 0;
  std::vector<double> free(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) total += free[i] = double(devices[i]->free_memory());
  if (total <= 0) return;
  for (size_t i = 0; i < devices.size(); ++i) mesh.ratios[i] = free[i] / total;
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelInfo& Model::info() const {
  return impl_->info;
}

namespace {

void build_tokenizer_once(Model::Impl& m) {
  std::call_once(m.tokenizer_once, [&m] {
    try {
      m.tokenizer = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(*m.file));
    } catch (const Error& e) {
      m.tokenizer_error = e.what();
    }
  });
}

}  // namespace

const tokenizer::Tokenizer& Model::tokenizer() const {
  build_tokenizer_once(*impl_);
  if (!impl_->tokenizer) throw Error(impl_->tokenizer_error);
  return *impl_->tokenizer;
}

bool Model::has_tokenizer() const {
  build_tokenizer_once(*impl_);
  return impl_->tokenizer != nullptr;
}

std::shared_ptr<Model> Model::load(const std::string& path, const ModelParams& params) {
  check(params.n_threads >= 0, "the number of threads must be >= 0 (0 = all hardware threads)");
  auto impl = std::make_unique<Impl>();
  // The mesh is checked before the file is opened, so bad flags are reported first (the command line has
  // built it already: params.mesh).
  MeshSpec mesh =
      params.mesh ? *params.mesh
                  : make_mesh_spec(params.devices, params.split_mode, params.tensor_split, params.main_device,
                                   params.replicate_kv, parse_device_id(params.device, "device"));
  impl->file = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path));
  const gguf::GgufFile& f = *impl->file;
  const Model* lender = params.share_weights_from.get();
  const ModelHparams hp = read_model_hparams(f, lender ? lender->info().n_vocab : 0);
  // A lender split over devices (or on another device) has no whole tensor to hand out; a dflash drafter
  // then reads the missing tensors from the lender's file onto its own device (on the CPU: the same mapped
  // bytes).
  bool borrow_from_file = false;
  if (lender) {
    const Model::Impl& li = lender->impl();
    const bool whole = li.mesh.mode == SplitMode::None && li.main_device().id() == mesh.devices.front();
    borrow_from_file = !whole && f.architecture() == "dflash";
    check(mesh.mode == SplitMode::None && (li.mesh.mode == SplitMode::None || borrow_from_file),
          "sharing weights between models needs both unsplit (--split-mode none)");
    check(li.main_device().id() == mesh.devices.front() || borrow_from_file,
          "weights can be shared only between models on the same device: the other model is on " +
              li.main_device().id().to_string() + ", this one on " + mesh.devices.front().to_string());
    impl->shared_from = params.share_weights_from;
  }
  const ShardDims dims = shard_dims(f, hp);
  plan_shards(mesh, dims);  // every split error, before devices are created or weights read

  // Started by mpirun as one of several processes: this process is one rank of the split (process_world.h).
  const bool across_processes =
      launcher_world().size > 1 && mesh.mode != SplitMode::None && mesh.n_ranks() > 1;
  int process_rank = 0;
  if (across_processes) {
    check(mesh.mode == SplitMode::Tensor || mesh.mode == SplitMode::Layer,
          std::string("--split-mode ") + split_mode_name(mesh.mode) +
              ": ranks in separate processes (mpirun) run tensor and layer splits; a row split gathers every "
              "product on the main device, so run it in one process");
    const ProcessWorld& world = process_world();
    check(int(mesh.n_ranks()) == world.size,
          "--devices lists " + std::to_string(mesh.n_ranks()) + " devices, but mpirun started " +
              std::to_string(world.size) + " processes: give one device per process");
    process_rank = world.rank;
  }

  // Devices. CPU "devices" share the machine's cores: each gets an equal part unless told otherwise.
  const size_t n_dev = mesh.n_ranks();
  DeviceOptions options;
  options.n_threads = params.n_threads;
  if (options.n_threads == 0 && n_dev > 1 && mesh.devices[0].kind == DeviceKind::CPU)
    options.n_threads = int(std::max<size_t>(1, std::max(1u, std::thread::hardware_concurrency()) / n_dev));
  if (across_processes) {
    impl->devices.push_back(create_device(mesh.devices[size_t(process_rank)], options));
  } else {
    for (const DeviceId& id : mesh.devices) impl->devices.push_back(create_device(id, options));
    ratios_by_free_memory(mesh, impl->devices);
  }
  const std::vector<RankShard> shards = plan_shards(mesh, dims);
  impl->shards = shards;

  std::vector<Device*> devs;
  for (auto& d : impl->devices) devs.push_back(d.get());
  if (devs.size() > 1)
    enable_peer_access(devs);  // layer hand-overs, row gathers and the copy comm use peer copies
  DecoderLoadContext ctx;
  ctx.dims = dims;
  if (lender && !borrow_from_file) ctx.borrow = &lender->impl().decoder();
  if (borrow_from_file) ctx.borrow_file = lender->impl().file.get();
  ctx.rules = shard_rules_of(f);
  if (across_processes) {
    Device& d = *impl->devices.front();
    impl->comm = create_process_comm(d);
    impl->process_rank = process_rank;
    // The tensor split's all-reduces run inside the forward; the layer split's hand-overs between processes
    // are the session's (broadcasts of the hidden state), so its decoder gets no comm.
    if (mesh.mode == SplitMode::Tensor) ctx.comm = impl->comm.get();
    ctx.device = d.id();
    ctx.shard = shards[size_t(process_rank)];
    impl->decoders.push_back(load_decoder_model(f, hp, ctx));
    impl->ranks.push_back({&d, &d.ops(), impl->decoders.back().get()});
  } else if (mesh.mode == SplitMode::Row && n_dev > 1) {
    const size_t main = size_t(mesh.main_device);
    impl->row_split = std::make_unique<RowSplitWeights>(devs, mesh.main_device, mesh.ratios);
    ctx.device = mesh.devices[main];
    ctx.shard = shards[main];
    ctx.row_split = impl->row_split.get();
    impl->decoders.push_back(load_decoder_model(f, hp, ctx));
    impl->row_ops = std::make_unique<RowSplitOps>(*impl->row_split);
    impl->ranks.push_back({devs[main], impl->row_ops.get(), impl->decoders.back().get()});
  } else {
    if (mesh.mode == SplitMode::Tensor && n_dev > 1) {
      // The decoders' own comm (a fallback: sessions pass theirs in ForwardInputs::comm).
      impl->comm = create_comm(devs);
      ctx.comm = impl->comm.get();
    }
    for (size_t r = 0; r < n_dev; ++r) {
      ctx.device = mesh.devices[r];
      ctx.shard = shards[r];
      impl->decoders.push_back(load_decoder_model(f, hp, ctx));
      impl->ranks.push_back({devs[r], &devs[r]->ops(), impl->decoders.back().get()});
    }
  }

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
  info.device = impl->main_device().name();
  info.split_mode = split_mode_name(mesh.mode);
  if (across_processes) {
    for (size_t r = 0; r < n_dev; ++r)
      info.devices.push_back(int(r) == process_rank
                                 ? impl->devices.front()->name()
                                 : mesh.devices[r].to_string() + " (process " + std::to_string(r) + ")");
  } else {
    for (auto& d : impl->devices) info.devices.push_back(d->name());
  }
  impl->mesh = std::move(mesh);
  return std::shared_ptr<Model>(new Model(std::move(impl)));
}

}  // namespace tandem
