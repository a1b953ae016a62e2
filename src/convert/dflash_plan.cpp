#include "convert/dflash_plan.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tandem::convert {

using nlohmann::json;

bool is_dflash_architecture(std::string_view hf_architecture) {
  return hf_architecture == "DFlashDraftModel";
}

DflashConfig parse_dflash_config(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(source + ": invalid JSON: " + e.what());
  }
  check(j.is_object() && j.contains("architectures") && j["architectures"].is_array() &&
            !j["architectures"].empty() && j["architectures"][0].is_string() &&
            is_dflash_architecture(j["architectures"][0].get<std::string>()),
        source + ": not a DFlash checkpoint (architectures [\"DFlashDraftModel\"])");
  // The Qwen3 part is read as a Qwen3 config (the same keys and checks).
  json q = j;
  q["architectures"] = json::array({"Qwen3ForCausalLM"});
  DflashConfig c;
  c.hp = parse_hf_config(q.dump(), source);
  c.hp.hf_architecture = "DFlashDraftModel";
  c.hp.arch = "dflash";
  if (j.contains("block_size") && !j["block_size"].is_null()) {
    check(j["block_size"].is_number_integer() && j["block_size"].get<int64_t>() >= 2 &&
              j["block_size"].get<int64_t>() <= 4096,
          source + ": \"block_size\" must be an integer in [2, 4096], got " + j["block_size"].dump());
    c.block_size = j["block_size"].get<int64_t>();
  }
  check(j.contains("dflash_config") && j["dflash_config"].is_object(),
        source + ": no \"dflash_config\" object (target_layer_ids, mask_token_id)");
  const json d = j["dflash_config"];
  check(d.contains("target_layer_ids") && d["target_layer_ids"].is_array() && !d["target_layer_ids"].empty(),
        source + ": dflash_config.target_layer_ids must be a non-empty list of layer ids");
  std::set<int64_t> seen;
  for (const json& v : d["target_layer_ids"]) {
    check(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 20),
          source + ": dflash_config.target_layer_ids has a bad entry " + v.dump());
    check(seen.insert(v.get<int64_t>()).second,
          source + ": dflash_config.target_layer_ids lists " + v.dump() + " twice");
    c.target_layers.push_back(int32_t(v.get<int64_t>() + 1));  // HF hidden_states[id + 1] = input of id + 1
  }
  check(d.contains("mask_token_id") && d["mask_token_id"].is_number_integer() &&
            d["mask_token_id"].get<int64_t>() >= 0,
        source + ": dflash_config.mask_token_id must be a token id");
  c.mask_token_id = d["mask_token_id"].get<int64_t>();
  if (j.contains("has_embed_tokens") && j["has_embed_tokens"].is_boolean())
    c.has_embed_tokens = j["has_embed_tokens"].get<bool>();
  // Sliding layers only when all three are given (llama.cpp's converter writes its keys on the same
  // condition; otherwise every layer attends to the whole context).
  const bool use_swa = j.contains("use_sliding_window") && j["use_sliding_window"].is_boolean() &&
                       j["use_sliding_window"].get<bool>();
  const bool has_window = j.contains("sliding_window") && !j["sliding_window"].is_null();
  const bool has_types = j.contains("layer_types") && !j["layer_types"].is_null();
  if (use_swa && has_window && has_types) {
    check(j["sliding_window"].is_number_integer() && j["sliding_window"].get<int64_t>() > 0 &&
              j["sliding_window"].get<int64_t>() <= (int64_t(1) << 30),
          source + ": \"sliding_window\" must be a positive integer, got " + j["sliding_window"].dump());
    const json& types = j["layer_types"];
    check(types.is_array() && int64_t(types.size()) == c.hp.n_layer,
          source + ": \"layer_types\" must list one entry per layer (" + std::to_string(c.hp.n_layer) + ")");
    for (const json& t : types) {
      check(t.is_string() && (t == "sliding_attention" || t == "full_attention"),
            source + ": \"layer_types\" entries must be \"sliding_attention\" or \"full_attention\", got " +
                t.dump());
      c.sliding.push_back(t == "sliding_attention");
    }
    c.sliding_window = j["sliding_window"].get<int64_t>();
  }
  return c;
}

std::vector<PlannedTensor> plan_dflash_tensors(const DflashConfig& c, const std::string& px) {
  // The Qwen3 plan, renamed: z-lab modules may sit at the top level (no "model." prefix).
  ModelHparams q = c.hp;
  q.arch = "qwen3";
  q.tie_word_embeddings = false;
  std::vector<PlannedTensor> out;
  const int64_t E = c.hp.n_embd, F = int64_t(c.target_layers.size()) * E;
  auto rename = [&](std::string hf) {
    if (hf.rfind("model.", 0) == 0) hf = px + hf.substr(6);
    return hf;
  };
  for (PlannedTensor t : plan_tensors(q)) {
    if (t.gguf_name == "token_embd.weight" || t.gguf_name == "output.weight") t.optional = true;
    if (t.gguf_name == "output.weight") continue;  // added below, after the encoder tensors
    if (t.gguf_name == "output_norm.weight") {
      out.push_back({"fc.weight", px + "fc.weight", {F, E}, 0, -1, false, 0});
      out.push_back({"fc.scale", px + "fc.scale", {1}, 0, -1, true, 0});
      out.push_back({"enc.output_norm.weight", px + "hidden_norm.weight", {E}, 0, -1, false, 0});
    }
    t.hf_name = rename(t.hf_name);
    out.push_back(std::move(t));
  }
  out.push_back({"output.weight", "lm_head.weight", {E, c.hp.n_vocab}, 0, -1, true, 0});
  return out;
}

}  // namespace tandem::convert
