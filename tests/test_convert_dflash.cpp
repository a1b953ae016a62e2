// `tandem convert` of a z-lab DFlash checkpoint (DFlashDraftModel, GGUF-ARCH-FACTS E.1): a tiny checkpoint
// written here (modules at the top level: layers.N..., fc, hidden_norm, norm; no embeddings, no head) and a
// tiny Qwen3 target; the GGUF has the dflash keys (target_layers = HF ids + 1, block_size, mask token, the
// target's vocabulary), fc / enc.output_norm / per-layer tensors with the checkpoint's values, and loads as a
// drafter of the converted target. Errors: no --target-model-dir, a hidden-size mismatch, a bad config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_convert_fixture.h"

namespace tandem::convert {
namespace {

using fixture::json;
using fixture::TempDir;
namespace fs = std::filesystem;

// A DFlash checkpoint for a target of width n_embd: one layer, taps of HF layers 0 and 1.
json dflash_config(int64_t n_embd) {
  return {{"architectures", {"DFlashDraftModel"}},
          {"model_type", "qwen3"},
          {"num_hidden_layers", 1},
          {"hidden_size", n_embd},
          {"intermediate_size", 96},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 32},
          {"vocab_size", 272},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"tie_word_embeddings", false},
          {"block_size", 8},
          {"dflash_config", {{"target_layer_ids", {0, 1}}, {"mask_token_id", 271}}}};
}

std::map<std::string, std::vector<float>> write_dflash(const fs::path& dir, const json& cfg) {
  fs::create_directories(dir);
  fixture::write_text(dir / "config.json", cfg.dump(2));
  const int64_t E = cfg["hidden_size"].get<int64_t>();
  std::map<std::string, std::vector<int64_t>> shapes = {
      {"fc.weight", {E, 2 * E}},
      {"hidden_norm.weight", {E}},
      {"norm.weight", {E}},
      {"layers.0.input_layernorm.weight", {E}},
      {"layers.0.post_attention_layernorm.weight", {E}},
      {"layers.0.self_attn.q_proj.weight", {128, E}},
      {"layers.0.self_attn.k_proj.weight", {64, E}},
      {"layers.0.self_attn.v_proj.weight", {64, E}},
      {"layers.0.self_attn.o_proj.weight", {E, 128}},
      {"layers.0.self_attn.q_norm.weight", {32}},
      {"layers.0.self_attn.k_norm.weight", {32}},
      {"layers.0.mlp.gate_proj.weight", {96, E}},
      {"layers.0.mlp.up_proj.weight", {96, E}},
      {"layers.0.mlp.down_proj.weight", {E, 96}},
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  SafetensorsWriter w;
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = (shape.size() == 1 ? 1.0f : 0.0f) + normal(rng);
    w.add_f32(name, shape, v);
    values[name] = v;
  }
  w.write(dir / "model.safetensors");
  return values;
}

TEST(ConvertDflash, KeysTensorsAndLoad) {
  TempDir tmp("dflash");
  fixture::Spec target_spec;
  target_spec.dtype = StDType::F32;
  fixture::write_checkpoint(tmp / "target", target_spec);
  const auto values = write_dflash(tmp / "drafter", dflash_config(target_spec.n_embd));

  ConvertOptions t;
  t.hf_dir = tmp / "target";
  t.output = tmp / "target.gguf";
  t.type = OutType::F32;
  convert_hf_to_gguf(t);
  ConvertOptions o;
  o.hf_dir = tmp / "drafter";
  o.output = tmp / "drafter.gguf";
  o.type = OutType::F32;
  o.target_model_dir = tmp / "target";
  const ConvertResult r = convert_hf_to_gguf(o);
  EXPECT_EQ(r.arch, "dflash");

  const gguf::GgufFile f = gguf::GgufFile::open(o.output.string());
  EXPECT_EQ(f.architecture(), "dflash");
  EXPECT_EQ(f.get("dflash.target_layers").as_int_array(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(f.get_int("dflash.block_size"), 8);
  EXPECT_EQ(f.get_int("tokenizer.ggml.mask_token_id"), 271);
  EXPECT_EQ(f.get_int("dflash.embedding_length"), target_spec.n_embd);
  EXPECT_NE(f.find("tokenizer.ggml.tokens"), nullptr);  // the target's vocabulary
  EXPECT_EQ(f.find_tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  // Values: an HF [out, in] weight is GGUF {in, out} with the same bytes.
  for (const auto& [gguf_name, hf_name] :
       std::map<std::string, std::string>{{"fc.weight", "fc.weight"},
                                          {"enc.output_norm.weight", "hidden_norm.weight"},
                                          {"output_norm.weight", "norm.weight"},
                                          {"blk.0.attn_k.weight", "layers.0.self_attn.k_proj.weight"},
                                          {"blk.0.ffn_down.weight", "layers.0.mlp.down_proj.weight"}}) {
    const gguf::TensorInfo* ti = f.find_tensor(gguf_name);
    ASSERT_NE(ti, nullptr) << gguf_name;
    ASSERT_EQ(ti->type, DType::F32);
    const std::vector<float>& want = values.at(hf_name);
    ASSERT_EQ(size_t(ti->nelements()), want.size()) << gguf_name;
    EXPECT_EQ(std::memcmp(f.tensor_data(*ti), want.data(), want.size() * 4), 0) << gguf_name;
  }
  EXPECT_EQ(f.find_tensor("fc.weight")->ne[0], 2 * target_spec.n_embd);

  // It loads as a drafter of the converted target and runs a feature step and a block.
  ModelParams mp;
  mp.n_threads = 1;
  const auto tm = Model::load(t.output.string(), mp);
  mp.share_weights_from = tm;
  const auto dm = Model::load(o.output.string(), mp);
  Session ds(dm, {.n_ctx = 64});
  Batch fb;
  fb.add_embedding(std::vector<float>(size_t(2 * target_spec.n_embd), 0.25f), 0, 0, false);
  ds.decode(fb);
  Batch b;
  b.mask.kind = AttentionMask::BlockBidirectional;
  b.add(3, 1, 0, false, false);
  b.add(271, 2, 0, true, false);
  ds.decode(b);
  for (float v : ds.logits(1)) ASSERT_TRUE(std::isfinite(v));
}

// Sliding layers as llama.cpp's converter writes them (use_sliding_window + sliding_window + layer_types ->
// dflash.attention.sliding_window / _pattern), and the loaded drafter honours them: a block attends to fewer
// injected positions than the same weights without the window.
TEST(ConvertDflash, SlidingLayersAreWrittenAndHonoured) {
  TempDir tmp("dflash_swa");
  fixture::Spec target_spec;
  target_spec.dtype = StDType::F32;
  fixture::write_checkpoint(tmp / "target", target_spec);
  ConvertOptions t;
  t.hf_dir = tmp / "target";
  t.output = tmp / "target.gguf";
  t.type = OutType::F32;
  convert_hf_to_gguf(t);
  auto convert = [&](const std::string& name, const json& cfg) {
    write_dflash(tmp / name, cfg);
    ConvertOptions o;
    o.hf_dir = tmp / name;
    o.output = tmp / (name + ".gguf");
    o.type = OutType::F32;
    o.target_model_dir = tmp / "target";
    convert_hf_to_gguf(o);
    return o.output;
  };
  json swa = dflash_config(target_spec.n_embd);
  swa["use_sliding_window"] = true;
  swa["sliding_window"] = 2;
  swa["layer_types"] = {"sliding_attention"};
  const fs::path with = convert("swa", swa);
  json no_use = swa;
  no_use["use_sliding_window"] = false;  // a window and types, but not used: every layer sees everything
  const fs::path without = convert("full", no_use);

  const gguf::GgufFile f = gguf::GgufFile::open(with.string());
  EXPECT_EQ(f.get_int("dflash.attention.sliding_window"), 2);
  const gguf::Value& pattern = f.get("dflash.attention.sliding_window_pattern");
  ASSERT_EQ(pattern.type(), gguf::ValueType::ARRAY);
  ASSERT_EQ(pattern.as_array().size(), 1u);
  EXPECT_TRUE(pattern.as_array()[0].as_bool());
  const gguf::GgufFile g = gguf::GgufFile::open(without.string());
  EXPECT_EQ(g.find("dflash.attention.sliding_window"), nullptr);
  EXPECT_EQ(g.find("dflash.attention.sliding_window_pattern"), nullptr);

  // Four injected positions, then a block at 4 and 5: with a window of 2 the block sees fewer of them.
  ModelParams mp;
  mp.n_threads = 1;
  const auto tm = Model::load(t.output.string(), mp);
  mp.share_weights_from = tm;
  auto block_logits = [&](const fs::path& drafter) {
    const auto dm = Model::load(drafter.string(), mp);
    Session ds(dm, {.n_ctx = 64});
    Batch fb;
    for (int p = 0; p < 4; ++p)
      fb.add_embedding(std::vector<float>(size_t(2 * target_spec.n_embd), 0.3f * float(p + 1) - 0.5f), p, 0,
                       false);
    ds.decode(fb);
    Batch b;
    b.mask.kind = AttentionMask::BlockBidirectional;
    b.add(3, 4, 0, false, false);
    b.add(271, 5, 0, true, false);
    ds.decode(b);
    const auto row = ds.logits(1);
    return std::vector<float>(row.begin(), row.end());
  };
  const auto a = block_logits(with), b = block_logits(without);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  EXPECT_NE(a, b);

  // A layer_types list of the wrong length is an error that names the key.
  json bad = swa;
  bad["layer_types"] = {"sliding_attention", "full_attention"};
  write_dflash(tmp / "bad", bad);
  ConvertOptions o;
  o.hf_dir = tmp / "bad";
  o.output = tmp / "bad.gguf";
  o.type = OutType::F32;
  o.target_model_dir = tmp / "target";
  try {
    convert_hf_to_gguf(o);
    ADD_FAILURE() << "a two-entry layer_types for one layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"layer_types\" must list one entry per layer (1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "bad.gguf"));
}

TEST(ConvertDflash, Errors) {
  TempDir tmp("dflash_errors");
  fixture::Spec target_spec;
  target_spec.dtype = StDType::F32;
  fixture::write_checkpoint(tmp / "target", target_spec);
  auto message = [&](const json& cfg, bool with_target) {
    fs::remove_all(tmp / "d");
    write_dflash(tmp / "d", cfg);
    ConvertOptions o;
    o.hf_dir = tmp / "d";
    o.output = tmp / "d.gguf";
    o.type = OutType::F32;
    if (with_target) o.target_model_dir = tmp / "target";
    try {
      convert_hf_to_gguf(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(dflash_config(64), false).find("--target-model-dir"), std::string::npos);
  EXPECT_NE(message(dflash_config(32), true).find("hidden_size (32) differs from the target's (64"),
            std::string::npos);
  json no_ids = dflash_config(64);
  no_ids["dflash_config"].erase("target_layer_ids");
  EXPECT_NE(message(no_ids, true).find("target_layer_ids"), std::string::npos);
  json far = dflash_config(64);
  far["dflash_config"]["target_layer_ids"] = {0, 7};
  EXPECT_NE(message(far, true).find("target layer id 7"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "d.gguf"));
}

}  // namespace
}  // namespace tandem::convert
