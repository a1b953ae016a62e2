#include "convert/diffusion_gemma_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "convert/gemma4_plan.h"
#include "core/error.h"

namespace tandem::convert {
using nlohmann::json;

namespace {

json parse(std::string_view text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(source + ": invalid JSON: " + e.what());
  }
}

// The first of `key` in the objects given (config.json top level, text_config, generation_config.json).
const json* lookup(std::initializer_list<const json*> objs, const char* key) {
  for (const json* o : objs)
    if (o && o->is_object() && o->contains(key) && !(*o)[key].is_null()) return &(*o)[key];
  return nullptr;
}

}  // namespace

bool is_diffusion_gemma_architecture(std::string_view a) {
  return a == "DiffusionGemmaForBlockDiffusion" || a == "DiffusionGemma4ModelForBlockDiffusion";
}

DiffusionGemmaConfig parse_diffusion_gemma_config(std::string_view config_json, const std::string& config_source,
                                                  std::string_view generation_json,
                                                  const std::string& generation_source) {
  json top = parse(config_json, config_source);
  check(top.is_object() && top.contains("architectures") && top["architectures"].is_array() &&
            !top["architectures"].empty() && top["architectures"][0].is_string() &&
            is_diffusion_gemma_architecture(top["architectures"][0].get<std::string>()),
        config_source + ": not a DiffusionGemmaForBlockDiffusion config");
  DiffusionGemmaConfig c;
  // The text hyperparameters are gemma4's (in text_config when present). The converter forces KV sharing
  // and per-layer inputs off (D.1): the diffusion model has neither.
  json text = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  text["architectures"] = json::array({"Gemma4ForCausalLM"});
  text.erase("text_config");
  text["num_kv_shared_layers"] = 0;
  text["hidden_size_per_layer_input"] = 0;
  // transformers 5.17's DiffusionGemmaTextConfig: full-attention layers have no v_proj (V = K) and take their
  // head_dim / num_key_value_heads from "per_layer_config" {"<layer>": {...}} instead of global_head_dim /
  // num_global_key_value_heads.
  text["attention_k_eq_v"] = true;
  // final_logit_softcapping is a class attribute of DiffusionGemmaTextConfig (30.0), not a field: config.json
  // does not carry it, and the model applies it.
  if (!text.contains("final_logit_softcapping") || text["final_logit_softcapping"].is_null())
    text["final_logit_softcapping"] = 30.0;
  fold_per_layer_config(text, config_source);
  if (!text.contains("tie_word_embeddings") && top.contains("tie_word_embeddings"))
    text["tie_word_embeddings"] = top["tie_word_embeddings"];
  c.text = parse_gemma4_config(text.dump(), config_source + (top.contains("text_config") ? " text_config" : ""));
  c.text.hf_architecture = top["architectures"][0].get<std::string>();
  c.text.tie_word_embeddings = true;  // D.1: lm_head is tied to the decoder's embed_tokens
  c.text.tensor_prefix = "model.decoder.";
  c.encoder_prefix = "model.encoder.language_model.";  // transformers 5.17 (convert also tries "model.encoder.")

  const json gen = generation_json.empty() ? json::object() : parse(generation_json, generation_source);
  const json* tc = top.contains("text_config") ? &top["text_config"] : nullptr;
  const json* cl = lookup({&top, tc, &gen}, "canvas_length");
  check(cl != nullptr, config_source + ": no \"canvas_length\" in config.json, its text_config or " +
                           generation_source + " (a diffusion model needs its canvas length)");
  check(cl->is_number_integer() && cl->get<int64_t>() > 0 && cl->get<int64_t>() <= 65536,
        config_source + ": \"canvas_length\" must be an integer in [1, 65536], got " + cl->dump());
  c.canvas_length = cl->get<int64_t>();
  if (const json* m = lookup({&top, tc, &gen}, "mask_token_id")) {
    check(m->is_number_integer() && m->get<int64_t>() >= 0,
          config_source + ": \"mask_token_id\" must be a non-negative integer, got " + m->dump());
    c.mask_token_id = m->get<int64_t>();
  }

  // Sampler defaults (D.1 table); absent fields are not written.
  using gguf::Value;
  const json* sampler = gen.contains("sampler_config") && gen["sampler_config"].is_object()
                            ? &gen["sampler_config"]
                            : nullptr;
  auto u32_key = [&](const char* key, const json* v) {
    if (!v) return;
    check(v->is_number_integer() && v->get<int64_t>() >= 0 && v->get<int64_t>() <= int64_t(UINT32_MAX),
          generation_source + ": \"" + key + "\" must be a non-negative integer, got " + v->dump());
    c.diffusion_keys.emplace_back(key, Value::u32(uint32_t(v->get<int64_t>())));
  };
  auto f32_key = [&](const char* key, const json* v) {
    if (!v) return;
    check(v->is_number() && std::isfinite(v->get<double>()),
          generation_source + ": \"" + key + "\" must be a number, got " + v->dump());
    c.diffusion_keys.emplace_back(key, Value::f32(float(v->get<double>())));
  };
  u32_key("diffusion.eb_max_steps", lookup({&gen}, "max_denoising_steps"));
  f32_key("diffusion.eb_t_min", lookup({&gen}, "t_min"));
  f32_key("diffusion.eb_t_max", lookup({&gen}, "t_max"));
  f32_key("diffusion.eb_entropy_bound", lookup({sampler}, "entropy_bound"));
  u32_key("diffusion.eb_stability_threshold", lookup({&gen}, "stability_threshold"));
  f32_key("diffusion.eb_confidence_threshold", lookup({&gen}, "confidence_threshold"));
  return c;
}

std::vector<PlannedTensor> plan_diffusion_gemma_tensors(const DiffusionGemmaConfig& c, int64_t n_vocab_gguf) {
  std::vector<PlannedTensor> plan = plan_gemma4_tensors(c.text, n_vocab_gguf);
  std::vector<PlannedTensor> out;
  const int64_t E = c.text.n_embd, F = c.text.n_ff;
  for (PlannedTensor& p : plan) {
    const bool scale = p.gguf_name.ends_with(".layer_output_scale.weight");
    if (scale) p.optional = false;  // D.2: the decoder scalar is required
    out.push_back(p);
    if (scale)
      out.push_back({"blk." + std::to_string(p.layer) + ".enc_layer_output_scale.weight",
                     c.encoder_prefix + "layers." + std::to_string(p.layer) + ".layer_scalar", {1}, 0, p.layer,
                     false, 0});
  }
  const std::string s = c.text.tensor_prefix + "self_conditioning.";
  out.push_back({"self_cond_pre_norm.weight", s + "pre_norm.weight", {E}, 0, -1, true, 0});
  out.push_back({"self_cond_gate.weight", s + "gate_proj.weight", {E, F}, 0, -1, true, 0});
  out.push_back({"self_cond_up.weight", s + "up_proj.weight", {E, F}, 0, -1, true, 0});
  out.push_back({"self_cond_down.weight", s + "down_proj.weight", {F, E}, 0, -1, true, 0});
  return out;
}

namespace {

const gguf::Value* find_key(const gguf::GgufWriter& w, const std::string& key) {
  for (const auto& [k, v] : w.metadata())
    if (k == key) return &v;
  return nullptr;
}

bool looks_like_control(const std::string& t) {
  if (t == "<s>" || t == "</s>") return true;
  const bool open = t.size() >= 3 && t.starts_with("<|") && t.back() == '>';
  const bool close = t.size() >= 3 && t.front() == '<' && t.ends_with("|>");
  return open || close;
}

}  // namespace

int64_t retype_control_tokens(gguf::GgufWriter& tok) {
  const gguf::Value* tokens = find_key(tok, "tokenizer.ggml.tokens");
  const gguf::Value* types = find_key(tok, "tokenizer.ggml.token_type");
  if (!tokens || !types) return 0;
  const std::vector<std::string> names = tokens->as_string_array();
  std::vector<int64_t> t = types->as_int_array();
  int64_t changed = 0;
  for (size_t i = 0; i < names.size() && i < t.size(); ++i)
    if ((t[i] == 1 || t[i] == 4) && looks_like_control(names[i])) {
      t[i] = 3;
      ++changed;
    }
  if (changed == 0) return 0;
  std::vector<int32_t> v(t.begin(), t.end());
  tok.set("tokenizer.ggml.token_type", gguf::Value::i32_array(v));
  return changed;
}

int64_t find_mask_token(const gguf::GgufWriter& tok, std::optional<int64_t> given, const std::string& where) {
  const gguf::Value* tokens = find_key(tok, "tokenizer.ggml.tokens");
  const int64_t n = tokens ? int64_t(tokens->as_array().size()) : 0;
  if (given) {
    check(*given < n, where + ": mask_token_id " + std::to_string(*given) + " is outside the tokenizer's " +
                          std::to_string(n) + " tokens");
    return *given;
  }
  if (tokens) {
    const std::vector<std::string> names = tokens->as_string_array();
    for (const char* m : {"<mask>", "<|mask|>", "[MASK]"})
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == m) return int64_t(i);
  }
  throw Error(where + ": no mask token: give \"mask_token_id\" in config.json or generation_config.json, or "
                      "have a <mask> / <|mask|> / [MASK] token in the tokenizer");
}

}  // namespace tandem::convert
