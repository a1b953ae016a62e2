// `tandem convert` of a tiny DiffusionGemmaForBlockDiffusion checkpoint (GGUF-ARCH-FACTS D.1): the decoder's
// tensors renamed like gemma4's, the encoder's layer scalars as enc_layer_output_scale, the other encoder and
// vision tensors dropped, the self_conditioning MLP, the diffusion-gemma.* and diffusion.* keys (canvas length,
// sampler defaults from generation_config.json), KV sharing and per-layer inputs forced off, control-looking
// tokens retyped CONTROL, the mask token; the file loads and runs as a canvas model.
#include <gtest/gtest.h>

#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tandem/diffusion.h"
#include "tandem/model.h"
#include "test_convert_fixture.h"

namespace tandem::convert {
namespace {
using namespace fixture;

constexpr int64_t kLayers = 2, kEmbd = 64, kFf = 96, kHead = 4, kKv = 2, kHd = 16, kGhd = 32, kVocab = 272;
bool sliding(int64_t il) {
  return il == 0;
}

json dg_config(bool with_canvas = true) {
  json text = {{"num_hidden_layers", kLayers},
               {"hidden_size", kEmbd},
               {"intermediate_size", kFf},
               {"num_attention_heads", kHead},
               {"num_key_value_heads", kKv},
               {"head_dim", kHd},
               {"per_layer_config", {{"1", {{"head_dim", kGhd}, {"num_key_value_heads", kKv}}}}},  // 5.17 style
               {"vocab_size", kVocab},
               {"sliding_window", 8},
               {"max_position_embeddings", 4096},
               {"rms_norm_eps", 1e-6},
               {"final_logit_softcapping", 30.0},
               {"num_kv_shared_layers", 1},          // forced to 0 by the converter
               {"hidden_size_per_layer_input", 16},  // likewise
               {"layer_types", {"sliding_attention", "full_attention"}},
               {"rope_parameters",
                {{"full_attention", {{"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.25}}},
                 {"sliding_attention", {{"rope_theta", 10000.0}}}}}};
  json c = {{"architectures", {"DiffusionGemmaForBlockDiffusion"}},
            {"model_type", "diffusion_gemma"},
            {"text_config", text},
            {"vision_config", nullptr},
            {"tie_word_embeddings", true}};
  if (with_canvas) c["canvas_length"] = 8;
  return c;
}

std::map<std::string, std::vector<int64_t>> dg_shapes() {
  std::map<std::string, std::vector<int64_t>> t;
  const std::string d = "model.decoder.";
  t[d + "embed_tokens.weight"] = {kVocab, kEmbd};
  t[d + "norm.weight"] = {kEmbd};
  t[d + "self_conditioning.pre_norm.weight"] = {kEmbd};
  t[d + "self_conditioning.gate_proj.weight"] = {kFf, kEmbd};
  t[d + "self_conditioning.up_proj.weight"] = {kFf, kEmbd};
  t[d + "self_conditioning.down_proj.weight"] = {kEmbd, kFf};
  t["model.vision_tower.patch.weight"] = {4, 4};  // dropped
  for (int64_t il = 0; il < kLayers; ++il) {
    const std::string p = d + "layers." + std::to_string(il) + ".";
    const int64_t hd = sliding(il) ? kHd : kGhd;
    t[p + "input_layernorm.weight"] = {kEmbd};
    t[p + "post_attention_layernorm.weight"] = {kEmbd};
    t[p + "pre_feedforward_layernorm.weight"] = {kEmbd};
    t[p + "post_feedforward_layernorm.weight"] = {kEmbd};
    t[p + "self_attn.q_proj.weight"] = {kHead * hd, kEmbd};
    t[p + "self_attn.k_proj.weight"] = {kKv * hd, kEmbd};
    if (sliding(il)) t[p + "self_attn.v_proj.weight"] = {kKv * hd, kEmbd};
    t[p + "self_attn.o_proj.weight"] = {kEmbd, kHead * hd};
    t[p + "self_attn.q_norm.weight"] = {hd};
    t[p + "self_attn.k_norm.weight"] = {hd};
    t[p + "mlp.gate_proj.weight"] = {kFf, kEmbd};
    t[p + "mlp.up_proj.weight"] = {kFf, kEmbd};
    t[p + "mlp.down_proj.weight"] = {kEmbd, kFf};
    t[p + "layer_scalar"] = {1};
    const std::string e = "model.encoder.layers." + std::to_string(il) + ".";
    t[e + "layer_scalar"] = {1};
    t[e + "self_attn.q_proj.weight"] = {kHead * hd, kEmbd};  // tied to the decoder: dropped
  }
  return t;
}

std::map<std::string, std::vector<float>> write_dg_checkpoint(const fs::path& dir, const json& config,
                                                              bool with_mask_token = true) {
  fs::create_directories(dir);
  write_text(dir / "config.json", config.dump(1));
  write_text(dir / "generation_config.json",
             json({{"max_denoising_steps", 20},
                   {"t_min", 0.3},
                   {"t_max", 0.9},
                   {"stability_threshold", 2},
                   {"confidence_threshold", 0.01},
                   {"sampler_config", {{"entropy_bound", 0.2}}}})
                 .dump(1));
  write_tokenizer(dir);
  if (with_mask_token) {  // a non-special added token that looks like a control token: retyped, and the mask
    std::ifstream in(dir / "tokenizer.json");
    json tok = json::parse(in);
    tok["added_tokens"].push_back({{"id", 261},
                                   {"content", "<|mask|>"},
                                   {"special", false},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false}});
    write_text(dir / "tokenizer.json", tok.dump(1));
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  SafetensorsWriter w;
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : dg_shapes()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng) + (name.ends_with("norm.weight") || name.ends_with("layer_scalar") ? 1.0f : 0.0f);
    w.add_f32(name, shape, v);
    values[name] = std::move(v);
  }
  w.write(dir / "model.safetensors");
  return values;
}

ConvertResult convert(const fs::path& hf, const fs::path& out) {
  ConvertOptions o;
  o.hf_dir = hf;
  o.output = out;
  o.type = OutType::F32;
  o.threads = 2;
  o.name = "tiny-dg";
  return convert_hf_to_gguf(o);
}

float scalar_of(const gguf::GgufFile& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? *reinterpret_cast<const float*>(f.tensor_data(*t)) : NAN;
}

TEST(ConvertDiffusionGemma, KeysTensorsTokensAndItRuns) {
  TempDir tmp("dg");
  const auto src = write_dg_checkpoint(tmp / "hf", dg_config());
  const ConvertResult r = convert(tmp / "hf", tmp / "out.gguf");
  EXPECT_EQ(r.arch, "diffusion-gemma");
  {
    const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
    EXPECT_EQ(f.get_string("general.architecture"), "diffusion-gemma");
    EXPECT_EQ(f.get_int("diffusion-gemma.block_count"), kLayers);
    EXPECT_EQ(f.get_int("diffusion-gemma.attention.shared_kv_layers"), 0);
    EXPECT_EQ(f.get_int("diffusion-gemma.embedding_length_per_layer_input"), 0);
    EXPECT_FALSE(f.get_bool("diffusion-gemma.attention.causal"));
    EXPECT_EQ(f.find("gemma4.block_count"), nullptr);
    EXPECT_EQ(f.get_int("diffusion.canvas_length"), 8);
    EXPECT_EQ(f.get_int("diffusion.eb_max_steps"), 20);
    EXPECT_FLOAT_EQ(float(f.get_float("diffusion.eb_t_min")), 0.3f);
    EXPECT_FLOAT_EQ(float(f.get_float("diffusion.eb_t_max")), 0.9f);
    EXPECT_FLOAT_EQ(float(f.get_float("diffusion.eb_entropy_bound")), 0.2f);
    EXPECT_EQ(f.get_int("diffusion.eb_stability_threshold"), 2);
    EXPECT_FLOAT_EQ(float(f.get_float("diffusion.eb_confidence_threshold")), 0.01f);
    EXPECT_EQ(f.get_int("tokenizer.ggml.mask_token_id"), 261);
    EXPECT_EQ(f.find("tokenizer.ggml.token_type")->as_int_array()[261], 3);  // <|mask|> retyped CONTROL
    for (int64_t il = 0; il < kLayers; ++il) {
      const std::string b = "blk." + std::to_string(il) + ".";
      EXPECT_EQ(scalar_of(f, b + "layer_output_scale.weight"),
                src.at("model.decoder.layers." + std::to_string(il) + ".layer_scalar")[0]);
      EXPECT_EQ(scalar_of(f, b + "enc_layer_output_scale.weight"),
                src.at("model.encoder.layers." + std::to_string(il) + ".layer_scalar")[0]);
      EXPECT_NE(f.find_tensor(b + "attn_q.weight"), nullptr);
    }
    EXPECT_EQ(f.find_tensor("blk.1.attn_v.weight"), nullptr);  // global layer, k_eq_v
    EXPECT_EQ(f.find_tensor("output.weight"), nullptr);        // tied
    const gguf::TensorInfo* g = f.find_tensor("self_cond_gate.weight");
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->ne[0], kEmbd);
    EXPECT_EQ(g->ne[1], kFf);
    EXPECT_EQ(reinterpret_cast<const float*>(f.tensor_data(*g))[1],
              src.at("model.decoder.self_conditioning.gate_proj.weight")[1]);
    for (const char* n : {"self_cond_pre_norm.weight", "self_cond_up.weight", "self_cond_down.weight"})
      EXPECT_NE(f.find_tensor(n), nullptr) << n;
  }
  auto model = Model::load((tmp / "out.gguf").string());
  const CanvasModelInfo info = canvas_model_info(*model);
  EXPECT_EQ(info.canvas_length, 8);
  EXPECT_EQ(info.mask_token, 261);
  EXPECT_EQ(info.eb_defaults.max_steps, 20);
  CanvasOptions o;
  o.max_prompt = 16;
  auto src_run = make_canvas_source(model, o);
  src_run->begin_block(std::vector<int32_t>{1, 2, 3});
  const Tensor& l = src_run->forward(std::vector<int32_t>(8, 261), false, 1.0f);
  EXPECT_EQ(l.ne[0], 262);  // 261 tokens + <|mask|>
  EXPECT_EQ(l.ne[1], 8);
}

TEST(ConvertDiffusionGemma, MissingCanvasLengthOrMaskTokenAreClearErrors) {
  TempDir tmp("dg_bad");
  write_dg_checkpoint(tmp / "a", dg_config(false));
  try {
    convert(tmp / "a", tmp / "a.gguf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("canvas_length"), std::string::npos) << e.what();
  }
  write_dg_checkpoint(tmp / "b", dg_config(), /*with_mask_token*/ false);
  try {
    convert(tmp / "b", tmp / "b.gguf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no mask token"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "b.gguf"));
}

}  // namespace
}  // namespace tandem::convert
