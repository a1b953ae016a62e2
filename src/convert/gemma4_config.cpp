#include "convert/gemma4_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tandem::convert {
using nlohmann::json;

namespace {

// Reads one JSON object's values with messages that name the file and the key.
struct Reader {
  const json& j;
  std::string source;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const char* k, bool allow_zero = false) const {
    check(has(k), source + ": missing \"" + k + "\"");
    const json& v = j[k];
    check(v.is_number_integer() && (v.get<int64_t>() > 0 || (allow_zero && v.get<int64_t>() == 0)),
          source + ": \"" + k + "\" must be a " + (allow_zero ? "non-negative" : "positive") +
              " integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* k, int64_t fallback, bool allow_zero = true) const {
    return has(k) ? integer(k, allow_zero) : fallback;
  }
  double number_or(const char* k, double fallback) const {
    if (!has(k)) return fallback;
    check(j[k].is_number() && std::isfinite(j[k].get<double>()),
          source + ": \"" + k + "\" must be a number, got " + j[k].dump());
    return j[k].get<double>();
  }
  bool boolean_or(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    check(j[k].is_boolean(), source + ": \"" + k + "\" must be true or false, got " + j[k].dump());
    return j[k].get<bool>();
  }
};

}  // namespace

bool is_gemma4_architecture(std::string_view a) {
  return a == "Gemma4ForCausalLM" || a == "Gemma4ForConditionalGeneration";
}

// transformers 5.17 saves the full-attention layers' head_dim / num_key_value_heads in "per_layer_config"
// {"<layer>": {...}} (keys zero-padded, e.g. "05") instead of global_head_dim / num_global_key_value_heads:
// fold them into those fields. An entry for a sliding layer must repeat the top-level values (tandem has one
// shape per layer kind), and the key must name a layer of "layer_types" when that list is present.
void fold_per_layer_config(nlohmann::json& text, const std::string& source) {
  if (!text.contains("per_layer_config") || !text["per_layer_config"].is_object()) return;
  const bool typed = text.contains("layer_types") && text["layer_types"].is_array();
  for (const auto& item : text["per_layer_config"].items()) {
    const std::string key = item.key();
    const nlohmann::json& o = item.value();  // a plain reference: clang 14 cannot capture structured bindings
    check(o.is_object(), source + ": per_layer_config[\"" + key + "\"] must be an object");
    bool full = true;
    if (typed) {
      const auto& types = text["layer_types"];
      check(!key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos &&
                std::stoll(key) < int64_t(types.size()),
            source + ": per_layer_config key \"" + key + "\" is not a layer index of layer_types");
      full = types[size_t(std::stoll(key))] == "full_attention";
    }
    auto take = [&](const char* field, const char* as) {
      if (!o.contains(field) || o[field].is_null()) return;
      if (!full) {  // a sliding layer: the top-level value is its shape
        check(text.contains(field) && text[field] == o[field],
              source + ": per_layer_config[\"" + key + "\"] gives the sliding layer " + field + " " +
                  o[field].dump() + "; tandem supports the top-level value for every sliding layer");
        return;
      }
      check(!text.contains(as) || text[as].is_null() || text[as] == o[field],
            source + ": per_layer_config gives layers different " + field +
                " values; tandem supports one value for all full-attention layers");
      text[as] = o[field];
    };
    take("head_dim", "global_head_dim");
    take("num_key_value_heads", "num_global_key_value_heads");
  }
  text.erase("per_layer_config");
}

Gemma4Hparams parse_gemma4_config(std::string_view json_text, const std::string& source) {
  json top;
  try {
    top = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(source + ": invalid JSON: " + e.what());
  }
  check(top.is_object() && top.contains("architectures") && top["architectures"].is_array() &&
            !top["architectures"].empty() && top["architectures"][0].is_string(),
        source + ": no \"architectures\" list");
  Gemma4Hparams hp;
  hp.hf_architecture = top["architectures"][0].get<std::string>();
  check(is_gemma4_architecture(hp.hf_architecture),
        source + ": architecture '" + hp.hf_architecture + "' is not a Gemma 4 text model");
  hp.tensor_prefix =
      hp.hf_architecture == "Gemma4ForConditionalGeneration" ? "model.language_model." : "model.";
  const bool nested = top.contains("text_config") && !top["text_config"].is_null();
  if (nested) check(top["text_config"].is_object(), source + ": \"text_config\" must be an object");
  json j = nested ? top["text_config"] : top;
  fold_per_layer_config(j, nested ? source + " text_config" : source);
  const Reader r{j, nested ? source + " text_config" : source};

  hp.n_layer = r.integer("num_hidden_layers");
  hp.n_ctx = r.integer_or("max_position_embeddings", 131072, false);
  hp.n_embd = r.integer("hidden_size");
  hp.n_ff = r.integer("intermediate_size");
  hp.n_head = r.integer("num_attention_heads");
  hp.n_head_kv = r.integer_or("num_key_value_heads", hp.n_head, false);
  hp.kv_global_in_config = r.has("num_global_key_value_heads");
  hp.n_head_kv_global = r.integer_or("num_global_key_value_heads", hp.n_head_kv, false);
  hp.head_dim = r.integer("head_dim");
  hp.global_head_dim = r.integer_or("global_head_dim", hp.head_dim, false);
  hp.n_vocab = r.integer("vocab_size");
  hp.n_swa = r.integer("sliding_window");
  hp.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  check(hp.rms_norm_eps > 0, r.source + ": \"rms_norm_eps\" must be positive");
  hp.shared_kv_layers = r.integer_or("num_kv_shared_layers", 0);
  check(hp.shared_kv_layers < hp.n_layer, r.source + ": \"num_kv_shared_layers\" (" +
                                              std::to_string(hp.shared_kv_layers) +
                                              ") must be below num_hidden_layers");
  hp.double_wide_mlp = r.boolean_or("use_double_wide_mlp", false);
  hp.k_eq_v = r.boolean_or("attention_k_eq_v", false);
  hp.n_embd_per_layer = r.integer_or("hidden_size_per_layer_input", 0);
  hp.n_vocab_per_layer = r.integer_or("vocab_size_per_layer_input", hp.n_vocab);
  const bool moe = r.boolean_or("enable_moe_block", r.integer_or("num_experts", 0) > 0);
  if (moe) {
    hp.n_expert = r.integer("num_experts");
    hp.n_expert_used = r.integer("top_k_experts");
    hp.n_ff_exp = r.integer("moe_intermediate_size");
    check(hp.n_expert_used <= hp.n_expert, r.source + ": \"top_k_experts\" exceeds \"num_experts\"");
  }
  hp.final_logit_softcapping = r.number_or("final_logit_softcapping", 0.0);
  check(!r.has("attn_logit_softcapping"),
        r.source + ": \"attn_logit_softcapping\" is set, but Gemma 4 has no attention softcapping");
  hp.tie_word_embeddings =
      Reader{top, source}.boolean_or("tie_word_embeddings", r.boolean_or("tie_word_embeddings", true));
  check(hp.n_head % hp.n_head_kv == 0 && hp.n_head % hp.n_head_kv_global == 0,
        r.source +
            ": num_attention_heads must be a multiple of num_key_value_heads and num_global_key_value_heads");
  check(hp.head_dim % 2 == 0 && hp.global_head_dim % 2 == 0,
        r.source + ": head_dim and global_head_dim must be even for RoPE");

  check(r.has("layer_types") && j["layer_types"].is_array() && int64_t(j["layer_types"].size()) == hp.n_layer,
        r.source + ": \"layer_types\" must list one entry per layer (" + std::to_string(hp.n_layer) + ")");
  for (const auto& t : j["layer_types"]) {
    check(t.is_string() && (t == "sliding_attention" || t == "full_attention"),
          r.source + ": \"layer_types\" entries must be \"sliding_attention\" or \"full_attention\", got " +
              t.dump());
    hp.sliding.push_back(t == "sliding_attention");
  }

  check(r.has("rope_parameters") && j["rope_parameters"].is_object(),
        r.source + ": missing \"rope_parameters\" (per layer type: full_attention, sliding_attention)");
  const json& rp = j["rope_parameters"];
  const Reader rr{rp, r.source + " rope_parameters"};
  hp.partial_rotary_swa = rr.number_or("partial_rotary_factor", 1.0);
  if (rp.contains("full_attention")) {
    check(rp["full_attention"].is_object(), rr.source + ": \"full_attention\" must be an object");
    const Reader f{rp["full_attention"], rr.source + ".full_attention"};
    hp.rope_theta = f.number_or("rope_theta", 1e6);
    hp.partial_rotary_global = f.number_or("partial_rotary_factor", 1.0);
  }
  check(rp.contains("sliding_attention") && rp["sliding_attention"].is_object() &&
            rp["sliding_attention"].contains("rope_theta"),
        rr.source + ": missing \"sliding_attention\": {\"rope_theta\": ...}");
  hp.rope_theta_swa =
      Reader{rp["sliding_attention"], rr.source + ".sliding_attention"}.number_or("rope_theta", 0);
  check(hp.rope_theta > 0 && hp.rope_theta_swa > 0, rr.source + ": rope_theta must be positive");
  check(hp.partial_rotary_swa > 0 && hp.partial_rotary_swa <= 1 && hp.partial_rotary_global > 0 &&
            hp.partial_rotary_global <= 1,
        rr.source + ": partial_rotary_factor must be in (0, 1]");
  return hp;
}

void add_gemma4_metadata(const Gemma4Hparams& hp, gguf::GgufWriter& w, const std::string& arch) {
  using gguf::Value;
  const std::string a = arch + ".";
  auto u32 = [](int64_t v) {
    check(v >= 0 && v <= int64_t(UINT32_MAX),
          "hyperparameter " + std::to_string(v) + " does not fit in uint32");
    return Value::u32(uint32_t(v));
  };
  auto i32_array = [&](auto per_layer) {
    std::vector<Value> v;
    for (int64_t il = 0; il < hp.n_layer; ++il) v.push_back(Value::i32(int32_t(per_layer(il))));
    return Value::array(gguf::ValueType::INT32, std::move(v));
  };
  w.set(a + "context_length", u32(hp.n_ctx));
  w.set(a + "embedding_length", u32(hp.n_embd));
  w.set(a + "block_count", u32(hp.n_layer));
  if (hp.double_wide_mlp)
    w.set(a + "feed_forward_length", i32_array([&](int64_t il) { return hp.n_ff_of(il); }));
  else
    w.set(a + "feed_forward_length", u32(hp.n_ff));
  w.set(a + "attention.head_count", u32(hp.n_head));
  if (hp.kv_global_in_config)
    w.set(a + "attention.head_count_kv", i32_array([&](int64_t il) { return hp.n_head_kv_of(il); }));
  else
    w.set(a + "attention.head_count_kv", u32(hp.n_head_kv));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(float(hp.rms_norm_eps)));
  w.set(a + "attention.key_length", u32(hp.global_head_dim));
  w.set(a + "attention.value_length", u32(hp.global_head_dim));
  w.set(a + "attention.key_length_swa", u32(hp.head_dim));
  w.set(a + "attention.value_length_swa", u32(hp.head_dim));
  w.set(a + "rope.dimension_count", u32(hp.global_head_dim));
  w.set(a + "rope.dimension_count_swa", u32(int64_t(double(hp.head_dim) * hp.partial_rotary_swa)));
  w.set(a + "rope.freq_base", Value::f32(float(hp.rope_theta)));
  w.set(a + "rope.freq_base_swa", Value::f32(float(hp.rope_theta_swa)));
  w.set(a + "attention.sliding_window", u32(hp.n_swa));
  std::vector<Value> pattern;
  for (bool s : hp.sliding) pattern.push_back(Value::boolean(s));
  w.set(a + "attention.sliding_window_pattern", Value::array(gguf::ValueType::BOOL, std::move(pattern)));
  w.set(a + "attention.shared_kv_layers", u32(hp.shared_kv_layers));
  w.set(a + "embedding_length_per_layer_input", u32(hp.n_embd_per_layer));
  if (hp.n_expert > 0) {
    w.set(a + "expert_count", u32(hp.n_expert));
    w.set(a + "expert_used_count", u32(hp.n_expert_used));
    w.set(a + "expert_feed_forward_length", u32(hp.n_ff_exp));
  }
  if (hp.final_logit_softcapping > 0)
    w.set(a + "final_logit_softcapping", Value::f32(float(hp.final_logit_softcapping)));
}

std::vector<float> gemma4_rope_freqs(const Gemma4Hparams& hp) {
  const int64_t n = hp.global_head_dim / 2;
  const int64_t rotated = int64_t(double(hp.global_head_dim) * hp.partial_rotary_global / 2.0);
  std::vector<float> out(size_t(n), 1e30f);
  for (int64_t i = 0; i < rotated && i < n; ++i) out[size_t(i)] = 1.0f;
  return out;
}

}  // namespace tandem::convert
