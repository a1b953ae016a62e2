// Tiny Hugging Face checkpoints for the `tandem convert` tests, written in C++: config.json, safetensors
// (single or sharded with an index), and a minimal valid byte-level BPE tokenizer.json. The expected GGUF
// names are written out by hand from ../shared/GGUF-ARCH-FACTS.md B.2, independently of the converter's plan.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "convert/safetensors.h"
#include "convert/safetensors_writer.h"
#include "core/half.h"

namespace tandem::convert::fixture {
namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("tandem_convert_test_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

// ---- the tiny checkpoint ---------------------------------------------------------------------------------

struct Spec {
  std::string hf_arch = "Qwen3ForCausalLM";
  int64_t n_layer = 2, n_embd = 64, n_ff = 96, n_head = 4, n_head_kv = 2, head_dim = 32, n_vocab = 272;
  bool write_head_dim = true;
  bool tied = false;
  bool attention_bias = false;
  StDType dtype = StDType::BF16;
  double rope_theta = 1000000.0;
  json rope_scaling = nullptr;
  int shards = 1;  // > 1: model-0000k-of-0000n.safetensors + index
  uint32_t seed = 42;
  float weight_std = 1.0f;  // standard deviation of the random weights

  bool llama() const { return hf_arch == "LlamaForCausalLM"; }
};

struct SourceTensor {
  std::vector<int64_t> shape;  // HF order
  std::vector<float> values;   // exactly what the checkpoint stores (already rounded to its dtype)
  std::vector<uint8_t> bytes;  // the raw checkpoint bytes
};

// The HF tensors of a spec, written out by hand (not from the converter's plan).
inline std::map<std::string, std::vector<int64_t>> hf_tensor_shapes(const Spec& s) {
  std::map<std::string, std::vector<int64_t>> t;
  const int64_t q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
  t["model.embed_tokens.weight"] = {s.n_vocab, s.n_embd};
  t["model.norm.weight"] = {s.n_embd};
  if (!s.tied) t["lm_head.weight"] = {s.n_vocab, s.n_embd};
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = {s.n_embd};
    t[p + "post_attention_layernorm.weight"] = {s.n_embd};
    t[p + "self_attn.q_proj.weight"] = {q, s.n_embd};
    t[p + "self_attn.k_proj.weight"] = {kv, s.n_embd};
    t[p + "self_attn.v_proj.weight"] = {kv, s.n_embd};
    t[p + "self_attn.o_proj.weight"] = {s.n_embd, q};
    if (s.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = {q};
      t[p + "self_attn.k_proj.bias"] = {kv};
      t[p + "self_attn.v_proj.bias"] = {kv};
      t[p + "self_attn.o_proj.bias"] = {s.n_embd};
    }
    if (!s.llama()) {
      t[p + "self_attn.q_norm.weight"] = {s.head_dim};
      t[p + "self_attn.k_norm.weight"] = {s.head_dim};
    }
    t[p + "mlp.gate_proj.weight"] = {s.n_ff, s.n_embd};
    t[p + "mlp.up_proj.weight"] = {s.n_ff, s.n_embd};
    t[p + "mlp.down_proj.weight"] = {s.n_embd, s.n_ff};
  }
  return t;
}

inline json config_of(const Spec& s) {
  json c = {{"architectures", {s.hf_arch}},
            {"model_type", s.llama() ? "llama" : "qwen3"},
            {"num_hidden_layers", s.n_layer},
            {"hidden_size", s.n_embd},
            {"intermediate_size", s.n_ff},
            {"num_attention_heads", s.n_head},
            {"num_key_value_heads", s.n_head_kv},
            {"vocab_size", s.n_vocab},
            {"max_position_embeddings", 4096},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", s.rope_theta},
            {"tie_word_embeddings", s.tied},
            {"attention_bias", s.attention_bias},
            {"torch_dtype", s.dtype == StDType::BF16 ? "bfloat16" : "float32"},
            {"rope_scaling", s.rope_scaling}};
  if (s.write_head_dim) c["head_dim"] = s.head_dim;
  return c;
}

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// GPT-2's byte -> printable character map, as UTF-8: the vocabulary of every byte-level BPE tokenizer.json.
inline std::string byte_token(int b) {
  int cp = b;
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      const bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      if (!p) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A minimal, valid byte-level BPE tokenizer.json of HF format (Qwen2-style pre-tokenizer): 256 byte tokens,
// three merges and two special tokens; the config's vocab_size (272) pads it, as real checkpoints do.
inline void write_tokenizer(const fs::path& dir) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(b)] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  const std::string regex =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+";
  json tok = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 259},
         {"content", "<|endoftext|>"},
         {"special", true},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false}},
        {{"id", 260},
         {"content", "<|im_start|>"},
         {"special", true},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false}}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", {"h e", "l l", "he ll"}}}}};
  write_text(dir / "tokenizer.json", tok.dump(1));
  write_text(
      dir / "tokenizer_config.json",
      json({{"eos_token", "<|endoftext|>"}, {"pad_token", "<|endoftext|>"}, {"bos_token", nullptr}}).dump(1));
}

// Writes config.json, the safetensors file(s) and the tokenizer into dir; returns the source tensors.
inline std::map<std::string, SourceTensor> write_checkpoint(const fs::path& dir, const Spec& s) {
  fs::create_directories(dir);
  write_text(dir / "config.json", config_of(s).dump(2));
  write_tokenizer(dir);

  std::mt19937 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::map<std::string, SourceTensor> src;
  std::vector<SafetensorsWriter> writers(size_t(s.shards));
  std::map<std::string, std::string> weight_map;
  size_t k = 0;
  for (const auto& [name, shape] : hf_tensor_shapes(s)) {
    SourceTensor t;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.values.resize(size_t(n));
    for (auto& v : t.values) v = s.weight_std * normal(rng);
    if (s.dtype == StDType::BF16) {
      t.bytes.resize(size_t(n) * 2);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(t.values[size_t(i)]);
        t.values[size_t(i)] = bf16_to_fp32(h);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    } else {
      t.bytes.resize(size_t(n) * 4);
      std::memcpy(t.bytes.data(), t.values.data(), t.bytes.size());
    }
    const size_t shard = k++ % size_t(s.shards);
    writers[shard].add(name, s.dtype, shape, t.bytes);
    if (s.shards > 1) {
      weight_map[name] =
          "model-0000" + std::to_string(shard + 1) + "-of-0000" + std::to_string(s.shards) + ".safetensors";
    }
    src[name] = std::move(t);
  }
  // Checkpoints often carry tensors llama.cpp does not use; the converter must skip them.
  writers[0].add_f32("model.layers.0.self_attn.rotary_emb.inv_freq", {s.head_dim / 2},
                     std::vector<float>(size_t(s.head_dim / 2), 0.5f));
  if (s.shards == 1) {
    writers[0].write(dir / "model.safetensors");
  } else {
    for (int i = 0; i < s.shards; ++i)
      writers[size_t(i)].write(dir / ("model-0000" + std::to_string(i + 1) + "-of-0000" +
                                      std::to_string(s.shards) + ".safetensors"));
    weight_map["model.layers.0.self_attn.rotary_emb.inv_freq"] =
        "model-00001-of-0000" + std::to_string(s.shards) + ".safetensors";
    write_safetensors_index(dir, weight_map);
  }
  return src;
}

// GGUF name -> HF name, written out by hand from the facts file's table B.2.
inline std::map<std::string, std::string> expected_names(const Spec& s) {
  std::map<std::string, std::string> m;
  m["token_embd.weight"] = "model.embed_tokens.weight";
  m["output_norm.weight"] = "model.norm.weight";
  if (!s.tied) m["output.weight"] = "lm_head.weight";
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
    m[b + "attn_norm.weight"] = h + "input_layernorm.weight";
    m[b + "attn_q.weight"] = h + "self_attn.q_proj.weight";
    m[b + "attn_k.weight"] = h + "self_attn.k_proj.weight";
    m[b + "attn_v.weight"] = h + "self_attn.v_proj.weight";
    m[b + "attn_output.weight"] = h + "self_attn.o_proj.weight";
    m[b + "ffn_norm.weight"] = h + "post_attention_layernorm.weight";
    m[b + "ffn_gate.weight"] = h + "mlp.gate_proj.weight";
    m[b + "ffn_up.weight"] = h + "mlp.up_proj.weight";
    m[b + "ffn_down.weight"] = h + "mlp.down_proj.weight";
    if (!s.llama()) {
      m[b + "attn_q_norm.weight"] = h + "self_attn.q_norm.weight";
      m[b + "attn_k_norm.weight"] = h + "self_attn.k_norm.weight";
    }
    if (s.attention_bias) {
      m[b + "attn_q.bias"] = h + "self_attn.q_proj.bias";
      m[b + "attn_k.bias"] = h + "self_attn.k_proj.bias";
      m[b + "attn_v.bias"] = h + "self_attn.v_proj.bias";
      m[b + "attn_output.bias"] = h + "self_attn.o_proj.bias";
    }
  }
  return m;
}

}  // namespace tandem::convert::fixture
