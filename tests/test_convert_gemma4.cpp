// `tandem convert` of tiny Gemma 4 checkpoints (dense with global KV heads and attention_k_eq_v, MoE in the
// 26B-A4B style, E2B style with per-layer inputs, KV sharing and the double-wide MLP). The expected keys,
// names and shapes are written out by hand from ../shared/GGUF-ARCH-FACTS.md C.1, C.2, C.3, C.7.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "convert/gemma4_config.h"
#include "convert/gemma4_layer_plan.h"
#include "convert/hf_to_gguf.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"
#include "test_cli_util.h"
#include "test_convert_fixture.h"

namespace tandem::convert {
namespace {
using namespace fixture;

struct G4 {
  bool moe = false, e2b = false, k_eq_v = true, global_kv = true;
  // 4 layers: sliding, sliding, sliding, full
  int64_t n_layer = 4, n_embd = 64, n_ff = 96, n_head = 4, n_kv = 2, n_kv_g = 1, hd = 32, ghd = 64;
  int64_t n_vocab = 272;  // the fixture tokenizer has 261 tokens: token_embd is trimmed to 261 rows
  int64_t n_expert = 4, n_used = 2, n_ff_exp = 32, n_pl = 16, shared = 0;
};

bool sliding(int64_t il) {
  return il % 4 != 3;
}

json g4_config(const G4& g) {
  json text = {{"num_hidden_layers", g.n_layer},
               {"hidden_size", g.n_embd},
               {"intermediate_size", g.n_ff},
               {"num_attention_heads", g.n_head},
               {"num_key_value_heads", g.n_kv},
               {"head_dim", g.hd},
               {"global_head_dim", g.ghd},
               {"vocab_size", g.n_vocab},
               {"sliding_window", 16},
               {"max_position_embeddings", 8192},
               {"rms_norm_eps", 1e-6},
               {"attention_k_eq_v", g.k_eq_v},
               {"final_logit_softcapping", 30.0},
               {"rope_parameters",
                {{"full_attention", {{"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.25}}},
                 {"sliding_attention", {{"rope_theta", 10000.0}}}}}};
  json types = json::array();
  for (int64_t il = 0; il < g.n_layer; ++il)
    types.push_back(sliding(il) ? "sliding_attention" : "full_attention");
  text["layer_types"] = types;
  if (g.global_kv) text["num_global_key_value_heads"] = g.n_kv_g;
  if (g.moe) {
    text["enable_moe_block"] = true;
    text["num_experts"] = g.n_expert;
    text["top_k_experts"] = g.n_used;
    text["moe_intermediate_size"] = g.n_ff_exp;
  }
  if (g.e2b) {
    text["hidden_size_per_layer_input"] = g.n_pl;
    text["vocab_size_per_layer_input"] = g.n_vocab;
    text["num_kv_shared_layers"] = g.shared;
    text["use_double_wide_mlp"] = true;
  }
  return {{"architectures", {"Gemma4ForCausalLM"}},
          {"model_type", "gemma4"},
          {"text_config", text},
          {"tie_word_embeddings", true}};
}

// HF name -> shape, by hand from the Gemma 4 modeling code's parameter names.
std::map<std::string, std::vector<int64_t>> g4_hf_shapes(const G4& g) {
  std::map<std::string, std::vector<int64_t>> t;
  t["model.embed_tokens.weight"] = {g.n_vocab, g.n_embd};
  t["model.norm.weight"] = {g.n_embd};
  if (g.e2b) {
    t["model.embed_tokens_per_layer.weight"] = {g.n_vocab, g.n_layer * g.n_pl};
    t["model.per_layer_model_projection.weight"] = {g.n_layer * g.n_pl, g.n_embd};
    t["model.per_layer_projection_norm.weight"] = {g.n_pl};
  }
  for (int64_t il = 0; il < g.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    const int64_t hd = sliding(il) ? g.hd : g.ghd;
    const int64_t kvh = sliding(il) || !g.global_kv ? g.n_kv : g.n_kv_g;
    const int64_t ff = g.e2b && il >= g.n_layer - g.shared ? 2 * g.n_ff : g.n_ff;
    t[p + "input_layernorm.weight"] = {g.n_embd};
    t[p + "post_attention_layernorm.weight"] = {g.n_embd};
    t[p + "pre_feedforward_layernorm.weight"] = {g.n_embd};
    t[p + "post_feedforward_layernorm.weight"] = {g.n_embd};
    t[p + "self_attn.q_proj.weight"] = {g.n_head * hd, g.n_embd};
    t[p + "self_attn.k_proj.weight"] = {kvh * hd, g.n_embd};
    if (sliding(il) || !g.k_eq_v) t[p + "self_attn.v_proj.weight"] = {kvh * hd, g.n_embd};
    t[p + "self_attn.o_proj.weight"] = {g.n_embd, g.n_head * hd};
    t[p + "self_attn.q_norm.weight"] = {hd};
    t[p + "self_attn.k_norm.weight"] = {hd};
    t[p + "mlp.gate_proj.weight"] = {ff, g.n_embd};
    t[p + "mlp.up_proj.weight"] = {ff, g.n_embd};
    t[p + "mlp.down_proj.weight"] = {g.n_embd, ff};
    t[p + "layer_scalar"] = {1};
    if (g.moe) {
      t[p + "router.proj.weight"] = {g.n_expert, g.n_embd};
      t[p + "router.scale"] = {g.n_embd};
      t[p + "router.per_expert_scale"] = {g.n_expert};
      t[p + "experts.gate_up_proj"] = {g.n_expert, 2 * g.n_ff_exp, g.n_embd};
      t[p + "experts.down_proj"] = {g.n_expert, g.n_embd, g.n_ff_exp};
      t[p + "pre_feedforward_layernorm_2.weight"] = {g.n_embd};
      t[p + "post_feedforward_layernorm_1.weight"] = {g.n_embd};
      t[p + "post_feedforward_layernorm_2.weight"] = {g.n_embd};
    }
    if (g.e2b) {
      t[p + "per_layer_input_gate.weight"] = {g.n_pl, g.n_embd};
      t[p + "per_layer_projection.weight"] = {g.n_embd, g.n_pl};
      t[p + "post_per_layer_input_norm.weight"] = {g.n_embd};
    }
  }
  return t;
}

// GGUF name -> HF name (facts C.2).
std::map<std::string, std::string> g4_names(const G4& g) {
  std::map<std::string, std::string> n = {{"token_embd.weight", "model.embed_tokens.weight"},
                                          {"output_norm.weight", "model.norm.weight"}};
  if (g.e2b) {
    n["per_layer_token_embd.weight"] = "model.embed_tokens_per_layer.weight";
    n["per_layer_model_proj.weight"] = "model.per_layer_model_projection.weight";
    n["per_layer_proj_norm.weight"] = "model.per_layer_projection_norm.weight";
  }
  for (int64_t il = 0; il < g.n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".", p = "model.layers." + std::to_string(il) + ".";
    n[b + "attn_norm.weight"] = p + "input_layernorm.weight";
    n[b + "attn_q.weight"] = p + "self_attn.q_proj.weight";
    n[b + "attn_k.weight"] = p + "self_attn.k_proj.weight";
    if (sliding(il) || !g.k_eq_v) n[b + "attn_v.weight"] = p + "self_attn.v_proj.weight";
    n[b + "attn_output.weight"] = p + "self_attn.o_proj.weight";
    n[b + "attn_q_norm.weight"] = p + "self_attn.q_norm.weight";
    n[b + "attn_k_norm.weight"] = p + "self_attn.k_norm.weight";
    n[b + "post_attention_norm.weight"] = p + "post_attention_layernorm.weight";
    n[b + "ffn_norm.weight"] = p + "pre_feedforward_layernorm.weight";
    n[b + "ffn_gate.weight"] = p + "mlp.gate_proj.weight";
    n[b + "ffn_up.weight"] = p + "mlp.up_proj.weight";
    n[b + "ffn_down.weight"] = p + "mlp.down_proj.weight";
    n[b + "post_ffw_norm.weight"] = p + "post_feedforward_layernorm.weight";
    n[b + "layer_output_scale.weight"] = p + "layer_scalar";
    if (g.moe) {
      n[b + "ffn_gate_inp.weight"] = p + "router.proj.weight";
      n[b + "ffn_gate_inp.scale"] = p + "router.scale";
      n[b + "ffn_down_exps.scale"] = p + "router.per_expert_scale";
      n[b + "ffn_gate_up_exps.weight"] = p + "experts.gate_up_proj";
      n[b + "ffn_down_exps.weight"] = p + "experts.down_proj";
      n[b + "pre_ffw_norm_2.weight"] = p + "pre_feedforward_layernorm_2.weight";
      n[b + "post_ffw_norm_1.weight"] = p + "post_feedforward_layernorm_1.weight";
      n[b + "post_ffw_norm_2.weight"] = p + "post_feedforward_layernorm_2.weight";
    }
    if (g.e2b) {
      n[b + "inp_gate.weight"] = p + "per_layer_input_gate.weight";
      n[b + "proj.weight"] = p + "per_layer_projection.weight";
      n[b + "post_norm.weight"] = p + "post_per_layer_input_norm.weight";
    }
  }
  return n;
}

// Writes the checkpoint (f32 random weights, never zeros) and returns name -> values.
std::map<std::string, std::vector<float>> write_g4(const fs::path& dir, const G4& g, const json& config) {
  fs::create_directories(dir);
  write_text(dir / "config.json", config.dump(1));
  write_tokenizer(dir);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  SafetensorsWriter w;
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : g4_hf_shapes(g)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng) + 0.01f;
    w.add_f32(name, shape, v);
    values[name] = std::move(v);
  }
  w.write(dir / "model.safetensors");
  return values;
}

ConvertResult run_convert(const fs::path& hf, const fs::path& out, OutType type = OutType::F32) {
  ConvertOptions o;
  o.hf_dir = hf;
  o.output = out;
  o.type = type;
  o.threads = 2;
  o.name = "tiny";
  return convert_hf_to_gguf(o);
}

// A tensor's dims (n_dims of them, innermost first).
std::vector<int64_t> dims(const gguf::TensorInfo* t) {
  return {t->ne.begin(), t->ne.begin() + t->n_dims};
}

uint64_t u32_of(const gguf::GgufFile& f, const std::string& k) {
  const gguf::Value* v = f.find(k);
  EXPECT_NE(v, nullptr) << k;
  if (!v) return ~0ull;
  EXPECT_EQ(v->type(), gguf::ValueType::UINT32) << k;
  return v->as_uint();
}
float f32_of(const gguf::GgufFile& f, const std::string& k) {
  const gguf::Value* v = f.find(k);
  EXPECT_NE(v, nullptr) << k;
  if (!v) return NAN;
  EXPECT_EQ(v->type(), gguf::ValueType::FLOAT32) << k;
  return float(v->as_float());
}
std::vector<int64_t> int_array(const gguf::GgufFile& f, const std::string& k, gguf::ValueType et) {
  const gguf::Value* v = f.find(k);
  EXPECT_NE(v, nullptr) << k;
  if (!v) return {};
  EXPECT_EQ(v->type(), gguf::ValueType::ARRAY) << k;
  EXPECT_EQ(v->element_type(), et) << k;
  std::vector<int64_t> out;
  for (const auto& e : v->as_array())
    out.push_back(et == gguf::ValueType::BOOL ? int64_t(e.as_bool()) : e.as_int());
  return out;
}

// Every tensor: the exact name set, ne = HF shape reversed (token_embd trimmed), type, values equal.
void expect_tensors(const gguf::GgufFile& f, const G4& g,
                    const std::map<std::string, std::vector<float>>& src, DType matrix_type) {
  const auto names = g4_names(g);
  std::set<std::string> got, want = {"rope_freqs.weight"};
  for (const auto& t : f.tensors()) got.insert(t.name);
  for (const auto& [gg, h] : names) want.insert(gg);
  EXPECT_EQ(got, want);
  const auto shapes = g4_hf_shapes(g);
  for (const auto& [gname, hname] : names) {
    const gguf::TensorInfo* t = f.find_tensor(gname);
    ASSERT_NE(t, nullptr) << gname;
    std::vector<int64_t> ne(shapes.at(hname).rbegin(), shapes.at(hname).rend());
    const bool trimmed = gname == "token_embd.weight" || gname == "per_layer_token_embd.weight";
    if (trimmed) ne.back() = 261;
    EXPECT_EQ(dims(t), ne) << gname;
    const bool router = gname.find("ffn_gate_inp.") != std::string::npos;
    EXPECT_EQ(t->type, ne.size() >= 2 && !router ? matrix_type : DType::F32) << gname;
    if (t->type != DType::F32) continue;
    const auto* data = reinterpret_cast<const float*>(f.tensor_data(*t));
    const auto& v = src.at(hname);
    // Norms are copied as they are (no +1, facts C.6); trimmed tensors keep their first rows.
    for (int64_t i = 0; i < t->nelements(); ++i)
      ASSERT_EQ(data[i], v[size_t(i)]) << gname << " [" << i << "]";
  }
}

TEST(ConvertGemma4, DenseKeysTensorsAndRopeFreqs) {
  TempDir tmp("g4_dense");
  G4 g;
  const auto src = write_g4(tmp / "hf", g, g4_config(g));
  const auto r = run_convert(tmp / "hf", tmp / "out.gguf");
  EXPECT_EQ(r.arch, "gemma4");
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(f.get_string("general.architecture"), "gemma4");
  EXPECT_EQ(u32_of(f, "gemma4.context_length"), 8192u);
  EXPECT_EQ(u32_of(f, "gemma4.embedding_length"), 64u);
  EXPECT_EQ(u32_of(f, "gemma4.block_count"), 4u);
  EXPECT_EQ(u32_of(f, "gemma4.feed_forward_length"), 96u);
  EXPECT_EQ(u32_of(f, "gemma4.attention.head_count"), 4u);
  EXPECT_EQ(int_array(f, "gemma4.attention.head_count_kv", gguf::ValueType::INT32),
            (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(u32_of(f, "gemma4.attention.key_length"), 64u);
  EXPECT_EQ(u32_of(f, "gemma4.attention.value_length"), 64u);
  EXPECT_EQ(u32_of(f, "gemma4.attention.key_length_swa"), 32u);
  EXPECT_EQ(u32_of(f, "gemma4.attention.value_length_swa"), 32u);
  EXPECT_EQ(u32_of(f, "gemma4.rope.dimension_count"), 64u);
  EXPECT_EQ(u32_of(f, "gemma4.rope.dimension_count_swa"), 32u);  // no top-level partial_rotary_factor
  EXPECT_EQ(f32_of(f, "gemma4.rope.freq_base"), 1e6f);
  EXPECT_EQ(f32_of(f, "gemma4.rope.freq_base_swa"), 1e4f);
  EXPECT_EQ(u32_of(f, "gemma4.attention.sliding_window"), 16u);
  EXPECT_EQ(int_array(f, "gemma4.attention.sliding_window_pattern", gguf::ValueType::BOOL),
            (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(f32_of(f, "gemma4.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(u32_of(f, "gemma4.attention.shared_kv_layers"), 0u);
  EXPECT_EQ(u32_of(f, "gemma4.embedding_length_per_layer_input"), 0u);
  EXPECT_EQ(f32_of(f, "gemma4.final_logit_softcapping"), 30.0f);
  EXPECT_EQ(f.find("gemma4.expert_count"), nullptr);
  ASSERT_NE(f.find("tokenizer.ggml.add_bos_token"), nullptr);
  EXPECT_TRUE(f.find("tokenizer.ggml.add_bos_token")->as_bool());
  EXPECT_FALSE(f.find("tokenizer.ggml.add_space_prefix")->as_bool());
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->as_array().size(), 261u);  // not padded to vocab_size
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gemma4");            // facts C.1

  // rope_freqs: global_head_dim/2 = 32 entries; the first 64 * 0.25 / 2 = 8 are 1, the rest 1e30.
  const gguf::TensorInfo* rf = f.find_tensor("rope_freqs.weight");
  ASSERT_NE(rf, nullptr);
  EXPECT_EQ(dims(rf), (std::vector<int64_t>{32}));
  EXPECT_EQ(rf->type, DType::F32);
  const auto* freqs = reinterpret_cast<const float*>(f.tensor_data(*rf));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(freqs[i], i < 8 ? 1.0f : 1e30f) << i;
  expect_tensors(f, g, src, DType::F32);
}

TEST(ConvertGemma4, MoeExpertTensorsAndRouterStaysF32) {
  TempDir tmp("g4_moe");
  G4 g;
  g.moe = true;
  g.k_eq_v = false;
  g.global_kv = false;
  const auto src = write_g4(tmp / "hf", g, g4_config(g));
  run_convert(tmp / "hf", tmp / "out.gguf");
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(u32_of(f, "gemma4.expert_count"), 4u);
  EXPECT_EQ(u32_of(f, "gemma4.expert_used_count"), 2u);
  EXPECT_EQ(u32_of(f, "gemma4.expert_feed_forward_length"), 32u);
  EXPECT_EQ(u32_of(f, "gemma4.attention.head_count_kv"), 2u);  // scalar without num_global_key_value_heads
  EXPECT_EQ(dims(f.find_tensor("blk.0.ffn_gate_up_exps.weight")), (std::vector<int64_t>{64, 64, 4}));
  EXPECT_EQ(dims(f.find_tensor("blk.0.ffn_down_exps.weight")), (std::vector<int64_t>{32, 64, 4}));
  expect_tensors(f, g, src, DType::F32);

  // F16: matrices and 3-D expert blocks become f16, the router and every 1-D tensor stay f32.
  run_convert(tmp / "hf", tmp / "out16.gguf", OutType::F16);
  const auto f16 = gguf::GgufFile::open((tmp / "out16.gguf").string());
  expect_tensors(f16, g, src, DType::F16);
  const gguf::TensorInfo* e = f16.find_tensor("blk.1.ffn_down_exps.weight");
  std::vector<float> got(size_t(e->nelements()));
  quant::dequantize_row(e->type, f16.tensor_data(*e), got.data(), e->nelements());
  const auto& want = src.at("model.layers.1.experts.down_proj");
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-3f * (1 + std::fabs(want[i]))) << i;

  // Q8_0: expert blocks quantize row by row (rows of ne[0]); values within the Q8_0 error.
  run_convert(tmp / "hf", tmp / "outq8.gguf", OutType::Q8_0);
  const auto q8 = gguf::GgufFile::open((tmp / "outq8.gguf").string());
  const gguf::TensorInfo* gu = q8.find_tensor("blk.2.ffn_gate_up_exps.weight");
  EXPECT_EQ(gu->type, DType::Q8_0);
  EXPECT_EQ(q8.find_tensor("blk.2.ffn_gate_inp.weight")->type, DType::F32);
  std::vector<float> deq(size_t(gu->nelements()));
  quant::dequantize_row(gu->type, q8.tensor_data(*gu), deq.data(), gu->nelements());
  const auto& gw = src.at("model.layers.2.experts.gate_up_proj");
  for (size_t i = 0; i < deq.size(); ++i) ASSERT_NEAR(deq[i], gw[i], 0.05f) << i;
}

TEST(ConvertGemma4, E2bPerLayerInputsKvSharingDoubleWideMlp) {
  TempDir tmp("g4_e2b");
  G4 g;
  g.e2b = true;
  g.shared = 2;  // layers 2, 3 share KV: they get 2x n_ff
  const auto src = write_g4(tmp / "hf", g, g4_config(g));
  run_convert(tmp / "hf", tmp / "out.gguf");
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(int_array(f, "gemma4.feed_forward_length", gguf::ValueType::INT32),
            (std::vector<int64_t>{96, 96, 192, 192}));
  EXPECT_EQ(u32_of(f, "gemma4.attention.shared_kv_layers"), 2u);
  EXPECT_EQ(u32_of(f, "gemma4.embedding_length_per_layer_input"), 16u);
  EXPECT_EQ(dims(f.find_tensor("per_layer_token_embd.weight")), (std::vector<int64_t>{64, 261}));
  EXPECT_EQ(dims(f.find_tensor("blk.3.ffn_down.weight")), (std::vector<int64_t>{192, 64}));
  expect_tensors(f, g, src, DType::F32);
}

// transformers 5.17 writes the full-attention layers' head_dim / KV heads in per_layer_config (the H200 run
// of gemma4_parity.py: convert refused its MoE checkpoints with "config.json implies [64, 64]").
TEST(ConvertGemma4, PerLayerConfigGivesTheGlobalLayersHeadDim) {
  json text = {{"head_dim", 16},
               {"num_key_value_heads", 2},
               {"per_layer_config",
                {{"2", {{"head_dim", 32}, {"num_key_value_heads", 1}}}, {"3", {{"head_dim", 32}}}}}};
  fold_per_layer_config(text, "config.json");
  EXPECT_EQ(text["global_head_dim"], 32);
  EXPECT_EQ(text["num_global_key_value_heads"], 1);
  EXPECT_FALSE(text.contains("per_layer_config"));
  // transformers' own keys are zero-padded ("05") and may come with layer_types.
  json padded = {{"head_dim", 16},
                 {"layer_types", {"sliding_attention", "full_attention"}},
                 {"per_layer_config", {{"01", {{"head_dim", 64}}}}}};
  fold_per_layer_config(padded, "config.json");
  EXPECT_EQ(padded["global_head_dim"], 64);
  auto expect_error = [](json j, const std::string& needle) {
    try {
      fold_per_layer_config(j, "config.json");
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"head_dim", 16},
                {"layer_types", {"sliding_attention", "full_attention"}},
                {"per_layer_config", {{"00", {{"head_dim", 32}}}}}},
               "gives the sliding layer head_dim 32");
  expect_error({{"layer_types", {"sliding_attention", "full_attention"}},
                {"per_layer_config", {{"2", {{"head_dim", 32}}}}}},
               "is not a layer index");
  json bad = {{"per_layer_config", {{"2", {{"head_dim", 32}}}, {"3", {{"head_dim", 64}}}}}};
  try {
    fold_per_layer_config(bad, "config.json");
    ADD_FAILURE() << "layers with different head_dim accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different head_dim"), std::string::npos) << e.what();
  }
}

TEST(ConvertGemma4, BadConfigsNameTheKey) {
  TempDir tmp("g4_bad");
  G4 g;
  auto expect_error = [&](json config, const std::string& needle) {
    const fs::path dir = tmp / "hf";
    fs::remove_all(dir);
    write_g4(dir, g, config);
    try {
      run_convert(dir, tmp / "out.gguf");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(tmp / "out.gguf"));
  };
  json c = g4_config(g);
  c["text_config"].erase("sliding_window");
  expect_error(c, "\"sliding_window\"");
  c = g4_config(g);
  c["text_config"].erase("head_dim");
  expect_error(c, "\"head_dim\"");
  c = g4_config(g);
  c["text_config"]["layer_types"].erase(0);
  expect_error(c, "\"layer_types\"");
  c = g4_config(g);
  c["text_config"]["rope_parameters"].erase("sliding_attention");
  expect_error(c, "sliding_attention");
  c = g4_config(g);
  c["text_config"]["attn_logit_softcapping"] = 50.0;
  expect_error(c, "attn_logit_softcapping");
  c = g4_config(g);
  c["architectures"] = {"Gemma5ForCausalLM"};
  expect_error(c, "Gemma5ForCausalLM");
  // A wrong shape: config says head_dim 32 but the checkpoint has 64-wide heads.
  {
    const fs::path dir = tmp / "hf";
    fs::remove_all(dir);
    G4 wrong = g;
    wrong.hd = 16;
    write_g4(dir, wrong, g4_config(g));
    try {
      run_convert(dir, tmp / "out.gguf");
      ADD_FAILURE() << "no error for a wrong shape";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("self_attn.q_proj.weight"), std::string::npos) << e.what();
    }
  }
}

// `quantize` of a gemma4 MoE file: 3-D expert blocks quantize row by row (rows of ne[0], every expert), the
// router (ffn_gate_inp), its scales and the norms stay F32, and q4_k_m gives ffn_down_exps Q6_K on the
// layers llama.cpp's use_more_bits picks (2 and 3 of 4) as it does ffn_down.
TEST(ConvertGemma4, QuantizeExpertBlocks) {
  TempDir tmp("g4_quant");
  G4 g;
  g.moe = true;
  g.n_embd = 256;
  g.n_ff = 256;
  g.n_ff_exp = 256;
  g.n_expert = 2;
  g.n_used = 1;
  const auto src = write_g4(tmp / "hf", g, g4_config(g));
  run_convert(tmp / "hf", tmp / "f32.gguf");
  const std::string in = (tmp / "f32.gguf").string();
  struct Case {
    const char* target;
    DType down0, down3, gate_up;
    float tol;  // of |deq - src| relative to the row's max |value|
  };
  const Case cases[] = {{"q8_0", DType::Q8_0, DType::Q8_0, DType::Q8_0, 0.01f},
                        {"q4_k", DType::Q4_K, DType::Q4_K, DType::Q4_K, 0.15f},
                        {"q5_k", DType::Q5_K, DType::Q5_K, DType::Q5_K, 0.08f},
                        {"q6_k", DType::Q6_K, DType::Q6_K, DType::Q6_K, 0.04f},
                        {"q4_k_m", DType::Q4_K, DType::Q6_K, DType::Q4_K, 0.15f},
                        {"q5_k_m", DType::Q5_K, DType::Q6_K, DType::Q5_K, 0.08f}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.target);
    const std::string out = (tmp / (std::string(c.target) + ".gguf")).string();
    quant::QuantizeOptions qo;
    qo.n_threads = 2;
    quant::quantize_model(in, out, quant::parse_quant_target(c.target), qo);
    const auto f = gguf::GgufFile::open(out);
    EXPECT_EQ(f.find_tensor("blk.0.ffn_down_exps.weight")->type, c.down0);
    EXPECT_EQ(f.find_tensor("blk.3.ffn_down_exps.weight")->type, c.down3);
    EXPECT_EQ(f.find_tensor("blk.2.ffn_down_exps.weight")->type, c.down3);
    EXPECT_EQ(f.find_tensor("blk.1.ffn_gate_up_exps.weight")->type, c.gate_up);
    for (const char* kept :
         {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp.scale", "blk.0.ffn_down_exps.scale",
          "blk.0.pre_ffw_norm_2.weight", "blk.0.layer_output_scale.weight"})
      EXPECT_EQ(f.find_tensor(kept)->type, DType::F32) << kept;
    EXPECT_EQ(dims(f.find_tensor("blk.0.ffn_gate_up_exps.weight")), (std::vector<int64_t>{256, 512, 2}));
    // Every expert's rows dequantize close to the checkpoint's values (the last expert too).
    for (const auto& [gname, hname] : std::map<std::string, std::string>{
             {"blk.0.ffn_down_exps.weight", "model.layers.0.experts.down_proj"},
             {"blk.3.ffn_gate_up_exps.weight", "model.layers.3.experts.gate_up_proj"}}) {
      const gguf::TensorInfo* t = f.find_tensor(gname);
      std::vector<float> deq(static_cast<size_t>(t->nelements()));
      quant::dequantize_row(t->type, f.tensor_data(*t), deq.data(), t->nelements());
      const auto& want = src.at(hname);
      ASSERT_EQ(deq.size(), want.size());
      const int64_t row = t->ne[0];
      double worst = 0;
      for (size_t r0 = 0; r0 < want.size(); r0 += size_t(row)) {
        float amax = 0;
        for (int64_t i = 0; i < row; ++i) amax = std::max(amax, std::fabs(want[r0 + size_t(i)]));
        for (int64_t i = 0; i < row; ++i)
          worst = std::max(worst, double(std::fabs(deq[r0 + size_t(i)] - want[r0 + size_t(i)]) / amax));
      }
      EXPECT_LT(worst, c.tol) << gname;
    }
  }
}

// The per-layer plan `inspect` shows: E2B-style file with KV sharing (layers 2, 3 of 4 share; 2 is sliding so
// it reads layer 0's KV, 3 is global and reads layer 1's... per facts C.7: n_layer - shared - 2 = 0 for
// sliding, n_layer - shared - 1 = 1 for global), per-layer KV heads and n_ff, and the MoE columns.
TEST(ConvertGemma4, InspectLayerPlan) {
  TempDir tmp("g4_inspect");
  G4 g;
  g.e2b = true;
  g.shared = 2;
  write_g4(tmp / "hf", g, g4_config(g));
  run_convert(tmp / "hf", tmp / "e2b.gguf");
  const auto f = gguf::GgufFile::open((tmp / "e2b.gguf").string());
  const auto plan = gemma4_layer_plan(f);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_TRUE(plan[0].sliding);
  EXPECT_FALSE(plan[3].sliding);
  EXPECT_EQ(plan[0].head_dim, 32);
  EXPECT_EQ(plan[3].head_dim, 64);
  EXPECT_EQ(plan[0].n_head_kv, 2);
  EXPECT_EQ(plan[3].n_head_kv, 1);
  EXPECT_EQ(plan[0].rope_base, 1e4);
  EXPECT_EQ(plan[3].rope_base, 1e6);
  EXPECT_EQ(plan[0].rope_dims, 32);
  EXPECT_EQ(plan[3].rope_dims, 64);
  EXPECT_FALSE(plan[0].rope_freqs);
  EXPECT_TRUE(plan[3].rope_freqs);
  EXPECT_EQ(plan[1].n_ff, 96);
  EXPECT_EQ(plan[2].n_ff, 192);
  EXPECT_EQ(plan[0].kv_source, -1);
  EXPECT_EQ(plan[1].kv_source, -1);
  EXPECT_EQ(plan[2].kv_source, 0);
  EXPECT_EQ(plan[3].kv_source, 1);
  EXPECT_EQ(plan[0].ffn, "dense");

  // The CLI, text and --json.
  const auto text = test::run_tandem("inspect " + (tmp / "e2b.gguf").string());
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("layers (gemma4):"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("layer 1"), std::string::npos) << text.out;
  const auto js = test::run_tandem("inspect --json " + (tmp / "e2b.gguf").string());
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const json j = json::parse(js.out);
  ASSERT_EQ(j["layers"].size(), 4u);
  EXPECT_EQ(j["layers"][3]["attention"], "global");
  EXPECT_EQ(j["layers"][3]["kv_source_layer"], 1);
  EXPECT_TRUE(j["layers"][0]["kv_source_layer"].is_null());
  EXPECT_EQ(j["layers"][2]["n_ff"], 192);

  // MoE: the expert columns.
  G4 m;
  m.moe = true;
  write_g4(tmp / "moe", m, g4_config(m));
  run_convert(tmp / "moe", tmp / "moe.gguf");
  const auto mp = gemma4_layer_plan(gguf::GgufFile::open((tmp / "moe.gguf").string()));
  EXPECT_EQ(mp[1].ffn, "dense+moe");
  EXPECT_EQ(mp[1].n_expert, 4);
  EXPECT_EQ(mp[1].n_expert_used, 2);
  EXPECT_EQ(mp[1].n_ff_exp, 32);
}

}  // namespace
}  // namespace tandem::convert
