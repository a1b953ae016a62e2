#include "convert/hf_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem::convert {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct ArchName {
  const char* hf;
  const char* gguf;
};
constexpr ArchName kArchs[] = {{"LlamaForCausalLM", "llama"}, {"Qwen3ForCausalLM", "qwen3"}};

// Reads config values with messages that name the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t positive_int(const char* key) const {
    check(has(key), source_ + ": missing \"" + key + "\"");
    return positive_int_value(j_[key], key);
  }
  int64_t positive_int_or(const char* key, int64_t fallback) const {
    return has(key) ? positive_int_value(j_[key], key) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    return has(key) ? number_value(j_[key], key) : fallback;
  }
  bool bool_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    check(j_[key].is_boolean(), source_ + ": \"" + key + "\" must be true or false, got " + j_[key].dump());
    return j_[key].get<bool>();
  }

  int64_t positive_int_value(const json& v, const std::string& key) const {
    check(v.is_number_integer() && v.get<int64_t>() > 0,
          source_ + ": \"" + key + "\" must be a positive integer, got " + v.dump());
    return v.get<int64_t>();
  }
  double number_value(const json& v, const std::string& key) const {
    check(v.is_number() && std::isfinite(v.get<double>()),
          source_ + ": \"" + key + "\" must be a number, got " + v.dump());
    return v.get<double>();
  }

 private:
  const json& j_;
  std::string source_;
};

RopeScaling parse_rope_scaling(const json& rs, const std::string& arch, const std::string& source) {
  RopeScaling out;
  check(rs.is_object(), source + ": \"rope_scaling\" must be an object or null, got " + rs.dump());
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
    type = rs["rope_type"].get<std::string>();
  } else if (rs.contains("type") && rs["type"].is_string()) {
    type = rs["type"].get<std::string>();
  }
  if (type.empty() || type == "default") return out;  // plain RoPE

  const ConfigReader r(rs, source + " rope_scaling");
  if (type == "linear" || type == "yarn") {
    out.type = type;
    out.factor = r.number_or("factor", 0.0);
    check(out.factor > 0, source + ": rope_scaling of type '" + type + "' needs a positive \"factor\"");
    if (type == "yarn")
      out.original_context_length = r.positive_int_or("original_max_position_embeddings", 0);
    return out;
  }
  if (type == "llama3") {
    check(arch == "llama", source + ": rope_scaling type 'llama3' is only supported for LlamaForCausalLM");
    out.type = type;
    // Defaults are the values of the Llama 3.1 release, as llama.cpp's converter uses them when a key is
    // absent.
    out.factor = r.number_or("factor", 8.0);
    out.low_freq_factor = r.number_or("low_freq_factor", 1.0);
    out.high_freq_factor = r.number_or("high_freq_factor", 4.0);
    out.original_context_length = r.positive_int_or("original_max_position_embeddings", 8192);
    check(out.factor > 0 && out.low_freq_factor > 0 && out.high_freq_factor > out.low_freq_factor,
          source + ": llama3 rope_scaling needs factor > 0 and 0 < low_freq_factor < high_freq_factor");
    return out;
  }
  throw Error(source + ": rope_scaling type '" + type +
              "' is not supported (supported: linear, yarn, llama3); converting it anyway would give a model "
              "that is silently wrong on long contexts");
}

std::string read_text_file(const fs::path& p) {
  return read_regular_file(p.string(), "the checkpoint's");  // a FIFO or directory is an error, not a hang
}

}  // namespace

std::string gguf_arch_for(std::string_view hf_architecture) {
  for (const auto& a : kArchs)
    if (hf_architecture == a.hf) return a.gguf;
  return "";
}

std::string supported_architectures() {
  std::string s;
  for (const auto& a : kArchs) s += std::string(s.empty() ? "" : ", ") + a.hf;
  return s + ", Gemma4ForCausalLM, Gemma4ForConditionalGeneration";  // gemma4: convert/gemma4_config.h
}

ModelHparams parse_hf_config(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(source + ": invalid JSON: " + e.what());
  }
  check(j.is_object(), source + ": expected a JSON object");
  check(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
            j["architectures"][0].is_string(),
        source + ": no \"architectures\" list (expected e.g. \"architectures\": [\"LlamaForCausalLM\"])");

  ModelHparams hp;
  hp.hf_architecture = j["architectures"][0].get<std::string>();
  hp.arch = gguf_arch_for(hp.hf_architecture);
  check(!hp.arch.empty(), source + ": unsupported architecture '" + hp.hf_architecture +
                              "'; tandem convert supports: " + supported_architectures());

  const ConfigReader r(j, source);
  hp.n_layer = r.positive_int("num_hidden_layers");
  hp.n_ctx = r.positive_int("max_position_embeddings");
  hp.n_embd = r.positive_int("hidden_size");
  hp.n_ff = r.positive_int("intermediate_size");
  hp.n_head = r.positive_int("num_attention_heads");
  hp.n_head_kv = r.positive_int_or("num_key_value_heads", hp.n_head);
  hp.n_vocab = r.positive_int("vocab_size");
  hp.head_dim_in_config = r.has("head_dim");
  if (hp.head_dim_in_config) {
    hp.head_dim = r.positive_int("head_dim");
  } else {
    check(hp.n_embd % hp.n_head == 0, source + ": hidden_size " + std::to_string(hp.n_embd) +
                                          " is not a multiple of num_attention_heads " +
                                          std::to_string(hp.n_head) + " and there is no \"head_dim\"");
    hp.head_dim = hp.n_embd / hp.n_head;
  }
  check(hp.n_head % hp.n_head_kv == 0, source + ": num_attention_heads " + std::to_string(hp.n_head) +
                                           " is not a multiple of num_key_value_heads " +
                                           std::to_string(hp.n_head_kv));
  check(hp.head_dim % 2 == 0,
        source + ": head_dim " + std::to_string(hp.head_dim) + " must be even for RoPE");

  // Newer transformers releases move rope_theta and the scaling into "rope_parameters".
  const json* rope_params =
      (j.contains("rope_parameters") && j["rope_parameters"].is_object()) ? &j["rope_parameters"] : nullptr;
  if (r.has("rope_theta")) {
    hp.rope_theta = r.number_value(j["rope_theta"], "rope_theta");
  } else if (rope_params && rope_params->contains("rope_theta")) {
    hp.rope_theta = r.number_value((*rope_params)["rope_theta"], "rope_parameters.rope_theta");
  }
  check(hp.rope_theta > 0, source + ": rope_theta must be positive");
  // HF's defaults (LlamaConfig and Qwen3Config both use 1e-6), so the file always has the key llama.cpp
  // requires.
  hp.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  check(hp.rms_norm_eps > 0, source + ": rms_norm_eps must be positive");
  hp.tie_word_embeddings = r.bool_or("tie_word_embeddings", false);
  hp.attention_bias = r.bool_or("attention_bias", false);
  hp.mlp_bias = r.bool_or("mlp_bias", false);

  if (r.has("rope_scaling")) {
    hp.rope_scaling = parse_rope_scaling(j["rope_scaling"], hp.arch, source);
  } else if (rope_params) {
    hp.rope_scaling = parse_rope_scaling(*rope_params, hp.arch, source);
  }
  return hp;
}

ModelHparams load_hf_config(const fs::path& hf_dir) {
  const fs::path p = hf_dir / "config.json";
  check(fs::exists(p),
        p.string() + " not found: tandem convert needs the Hugging Face config.json of the model");
  return parse_hf_config(read_text_file(p), p.string());
}

void add_hparams_metadata(const ModelHparams& hp, gguf::GgufWriter& w) {
  using gguf::Value;
  const std::string a = hp.arch + ".";
  // Every integer names the config.json key it came from, so an overflow says which value to fix.
  auto u32 = [](int64_t v, const char* config_key) {
    check(v >= 0 && v <= int64_t(UINT32_MAX),
          std::string("config.json: ") + config_key + " = " + std::to_string(v) +
              " does not fit in a GGUF uint32 (0 .. " + std::to_string(UINT32_MAX) + ")");
    return Value::u32(uint32_t(v));
  };
  w.set(a + "block_count", u32(hp.n_layer, "num_hidden_layers"));
  w.set(a + "context_length", u32(hp.n_ctx, "max_position_embeddings"));
  w.set(a + "embedding_length", u32(hp.n_embd, "hidden_size"));
  w.set(a + "feed_forward_length", u32(hp.n_ff, "intermediate_size"));
  w.set(a + "attention.head_count", u32(hp.n_head, "num_attention_heads"));
  w.set(a + "attention.head_count_kv", u32(hp.n_head_kv, "num_key_value_heads"));
  w.set(a + "rope.freq_base", Value::f32(float(hp.rope_theta)));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(float(hp.rms_norm_eps)));
  if (hp.head_dim_in_config) {
    w.set(a + "attention.key_length", u32(hp.head_dim, "head_dim"));
    w.set(a + "attention.value_length", u32(hp.head_dim, "head_dim"));
  }
  const auto& rs = hp.rope_scaling;
  if (rs.type == "linear" || rs.type == "yarn") {
    w.set(a + "rope.scaling.type", Value::string(rs.type));
    w.set(a + "rope.scaling.factor", Value::f32(float(rs.factor)));
    if (rs.type == "yarn" && rs.original_context_length > 0)
      w.set(a + "rope.scaling.original_context_length",
            u32(rs.original_context_length, "rope_scaling.original_max_position_embeddings"));
  }
  if (hp.arch == "llama") {
    w.set(a + "vocab_size", u32(hp.n_vocab, "vocab_size"));
    w.set(a + "rope.dimension_count", u32(hp.n_rot(), "head_dim"));
  }
}

std::vector<float> llama3_rope_freqs(const ModelHparams& hp) {
  const auto& rs = hp.rope_scaling;
  check(rs.type == "llama3", "internal: llama3_rope_freqs without llama3 rope scaling");
  const int64_t n_rot = hp.n_rot();
  const double old_ctx = double(rs.original_context_length);
  const double low_freq_wavelen = old_ctx / rs.low_freq_factor;    // longer wavelengths are scaled by factor
  const double high_freq_wavelen = old_ctx / rs.high_freq_factor;  // shorter ones are kept
  std::vector<float> out(size_t(n_rot / 2));
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(hp.rope_theta, -2.0 * double(i) / double(n_rot));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f;
    if (wavelen < high_freq_wavelen) {
      f = 1.0;
    } else if (wavelen > low_freq_wavelen) {
      f = rs.factor;
    } else {
      const double s = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = 1.0 / ((1.0 - s) / rs.factor + s);
    }
    out[size_t(i)] = float(f);
  }
  return out;
}

}  // namespace tandem::convert
