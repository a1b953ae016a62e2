// Architecture name -> hparams reader and loader. Adding an architecture: two functions and one line here.
#include <string>

#include "core/error.h"
#include "model/decoder.h"
#include "model/diffusion_gemma.h"
#include "model/dflash.h"
#include "model/gemma4.h"
#include "model/llama.h"
#include "model/qwen3.h"
#include "model/transformer.h"

namespace tandem {

namespace {

struct ArchEntry {
  const char* name;
  ModelHparams (*hparams)(const gguf::GgufFile&);
  std::unique_ptr<DecoderModel> (*load)(const gguf::GgufFile&, const ModelHparams&,
                                        const DecoderLoadContext&);
  ShardRuleTable (*rules)();
};

constexpr ArchEntry kArchitectures[] = {
    {"llama", llama_hparams, load_llama, transformer_shard_rules},
    {"qwen3", qwen3_hparams, load_qwen3, transformer_shard_rules},
    {"gemma4", gemma4_hparams, load_gemma4, gemma4_shard_rules},
    {"diffusion-gemma", diffusion_gemma_hparams, load_diffusion_gemma, diffusion_gemma_shard_rules},
    {"dflash", dflash_hparams, load_dflash, dflash_shard_rules},
};

const ArchEntry& arch_of(const gguf::GgufFile& file) {
  const std::string arch = file.architecture();
  check(!arch.empty(), file.path() + ": no general.architecture key; is this a model file?");
  for (const ArchEntry& a : kArchitectures)
    if (arch == a.name) return a;
  throw Error(file.path() + ": unknown architecture '" + arch + "'; supported: " + supported_architectures());
}

}  // namespace

std::string supported_architectures() {
  std::string s;
  for (const ArchEntry& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

ModelHparams read_model_hparams(const gguf::GgufFile& file, int64_t fallback_vocab) {
  ModelHparams hp = arch_of(file).hparams(file);
  if (hp.n_vocab == 0) {
    const gguf::TensorInfo* te = file.find_tensor("token_embd.weight");
    check(te != nullptr || fallback_vocab > 0, "missing tensor token_embd.weight");
    hp.n_vocab = te ? te->ne[1] : fallback_vocab;
  }
  return hp;
}

ShardRuleTable shard_rules_of(const gguf::GgufFile& file) {
  return arch_of(file).rules();
}

ShardDims shard_dims(const gguf::GgufFile& file, const ModelHparams& hp) {
  ShardDims d;
  d.n_layer = hp.n_layer;
  d.n_head = hp.n_head;
  d.n_head_kv = hp.n_head_kv;
  d.head_dim_k = hp.head_dim_k;
  d.head_dim_v = hp.head_dim_v;
  d.n_ff = hp.n_ff;
  d.n_vocab = hp.n_vocab;
  d.n_ff_exp = hp.n_ff_exp;
  bool uniform = true;
  for (const LayerHparams& l : hp.layers)
    uniform = uniform && l.n_head == hp.n_head && l.n_head_kv == hp.n_head_kv &&
              l.head_dim_k == hp.head_dim_k && l.head_dim_v == hp.head_dim_v && l.n_ff == hp.n_ff;
  if (!uniform)  // the planner cuts each layer on its own
    for (const LayerHparams& l : hp.layers)
      d.layers.push_back(LayerDims{l.n_head, l.n_head_kv, l.head_dim_k, l.head_dim_v, l.n_ff});
  // Column cuts must fall on block boundaries; every layer's type counts (a q4_k_m file mixes types).
  const ShardRuleTable rules = shard_rules_of(file);
  for (const gguf::TensorInfo& t : file.tensors()) {
    int64_t layer = -1;
    const ShardRule* rule = find_shard_rule(rules, t.name, &layer);
    if (!rule || rule->cut != TensorCut::InputColumns) continue;
    const int64_t blk = dtype_block_size(t.type);
    if (rule->unit == CutUnit::QHeadsV) d.attn_output_block = std::max(d.attn_output_block, blk);
    if (rule->unit == CutUnit::FfRows) d.ffn_down_block = std::max(d.ffn_down_block, blk);
    if (rule->unit == CutUnit::ExpertFfRows) d.ffn_down_exps_block = std::max(d.ffn_down_exps_block, blk);
  }
  return d;
}

std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, const ModelHparams& hp,
                                                 const DecoderLoadContext& ctx) {
  return arch_of(file).load(file, hp, ctx);
}

std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, DeviceId device) {
  const ModelHparams hp = read_model_hparams(file);
  DecoderLoadContext ctx;
  ctx.device = device;
  ctx.dims = shard_dims(file, hp);
  ctx.rules = shard_rules_of(file);
  MeshSpec whole;
  whole.devices = {device};
  whole.ratios = {1.0};
  ctx.shard = plan_shards(whole, ctx.dims).at(0);
  return load_decoder_model(file, hp, ctx);
}

}  // namespace tandem
