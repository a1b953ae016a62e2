// `tandem convert` (convert/hf_to_gguf.h): tiny Hugging Face checkpoints written here in C++ (config.json,
// safetensors, a byte-level BPE tokenizer.json) are converted and read back with GgufFile. The expectations
// (keys, names, shapes, the llama Q/K permutation, rope_freqs) are written out independently of the
// converter, from ../shared/GGUF-ARCH-FACTS.md B.1, B.2, B.5, B.6.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "convert/hf_to_gguf.h"
#include "convert/output_type.h"
#include "convert/safetensors_writer.h"
#include "convert/tensor_plan.h"
#include "core/error.h"
#include "core/half.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test_convert_fixture.h"

namespace tandem::convert {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace fixture;

ConvertResult convert(const fs::path& dir, const fs::path& out, OutType type,
                      std::vector<std::string>* log = nullptr) {
  ConvertOptions o;
  o.hf_dir = dir;
  o.output = out;
  o.type = type;
  o.threads = 2;
  o.name = "tiny";
  if (log) o.log = [log](const std::string& s) { log->push_back(s); };
  return convert_hf_to_gguf(o);
}

std::vector<float> gguf_values(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  std::vector<float> out(size_t(t.nelements()));
  quant::dequantize_row(t.type, f.tensor_data(t), out.data(), t.nelements());
  return out;
}

// Row r of an HF tensor whose rows are its outermost dim.
const float* hf_row(const SourceTensor& t, int64_t r) {
  int64_t row_elems = 1;
  for (size_t i = 1; i < t.shape.size(); ++i) row_elems *= t.shape[i];
  return t.values.data() + r * row_elems;
}

// The llama permutation, formulated as llama.cpp's converter states it: view the rows as
// [n_head, 2, d/2] and swap the last two axes, giving [n_head, d/2, 2]. GGUF row (h, i, half) <- HF row (h,
// half, i).
std::vector<float> llama_permute_reference(const SourceTensor& t, int64_t n_head) {
  const int64_t rows = t.shape[0];
  const int64_t row_elems = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t d = rows / n_head;
  std::vector<float> out(t.values.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t half = 0; half < 2; ++half)
      for (int64_t i = 0; i < d / 2; ++i) {
        const int64_t dst = h * d + i * 2 + half, from = h * d + half * (d / 2) + i;
        std::copy_n(hf_row(t, from), row_elems, out.begin() + dst * row_elems);
      }
  return out;
}

void expect_u32(const gguf::GgufFile& f, const std::string& key, uint64_t v) {
  const gguf::Value* x = f.find(key);
  ASSERT_NE(x, nullptr) << key;
  EXPECT_EQ(x->type(), gguf::ValueType::UINT32) << key;
  EXPECT_EQ(x->as_uint(), v) << key;
}
void expect_f32(const gguf::GgufFile& f, const std::string& key, double v) {
  const gguf::Value* x = f.find(key);
  ASSERT_NE(x, nullptr) << key;
  EXPECT_EQ(x->type(), gguf::ValueType::FLOAT32) << key;
  EXPECT_EQ(float(x->as_float()), float(v)) << key;
}

// Checks the tensor table against the hand-written names (and nothing else), shapes = HF shape reversed.
void expect_tensor_table(const gguf::GgufFile& f, const Spec& s,
                         const std::map<std::string, SourceTensor>& src,
                         const std::set<std::string>& extra = {}) {
  const auto names = expected_names(s);
  std::set<std::string> got, want(extra);
  for (const auto& t : f.tensors()) got.insert(t.name);
  for (const auto& [g, h] : names) want.insert(g);
  EXPECT_EQ(got, want);
  for (const auto& [g, h] : names) {
    const gguf::TensorInfo* t = f.find_tensor(g);
    ASSERT_NE(t, nullptr) << g;
    const auto& shape = src.at(h).shape;
    ASSERT_EQ(t->n_dims, shape.size()) << g;
    for (size_t d = 0; d < shape.size(); ++d)
      EXPECT_EQ(t->ne[d], shape[shape.size() - 1 - d]) << g << " dim " << d;
    if (shape.size() == 1) {
      EXPECT_EQ(t->type, DType::F32) << g << ": 1-D tensors are always f32";
    }
  }
}

double rel_rms(const std::vector<float>& ref, const std::vector<float>& got) {
  return quant::relative_rms_error(ref.data(), got.data(), int64_t(ref.size()));
}

// ---- conversions -----------------------------------------------------------------------------------------

TEST(Convert, Qwen3Bf16KeepsSourceBytesKeysNamesAndShapes) {
  TempDir tmp("qwen3_bf16");
  Spec s;  // qwen3, bf16, untied, head_dim 32 so n_head * head_dim (128) != n_embd (64)
  const auto src = write_checkpoint(tmp / "hf", s);
  std::vector<std::string> log;
  const auto r = convert(tmp / "hf", tmp / "out.gguf", OutType::BF16, &log);
  EXPECT_EQ(r.arch, "qwen3");
  EXPECT_EQ(r.type, OutType::BF16);
  EXPECT_FALSE(fs::exists(tmp / "out.gguf.tmp"));

  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(f.get_string("general.name"), "tiny");
  expect_u32(f, "qwen3.block_count", 2);
  expect_u32(f, "qwen3.context_length", 4096);
  expect_u32(f, "qwen3.embedding_length", 64);
  expect_u32(f, "qwen3.feed_forward_length", 96);
  expect_u32(f, "qwen3.attention.head_count", 4);
  expect_u32(f, "qwen3.attention.head_count_kv", 2);
  expect_u32(f, "qwen3.attention.key_length", 32);
  expect_u32(f, "qwen3.attention.value_length", 32);
  expect_f32(f, "qwen3.rope.freq_base", 1000000.0);
  expect_f32(f, "qwen3.attention.layer_norm_rms_epsilon", 1e-5);
  expect_u32(f, "general.file_type", 32);
  expect_u32(f, "general.quantization_version", 2);
  // qwen3 gets no rope.dimension_count (n_rot = key_length) and no vocab_size (facts B.1).
  EXPECT_EQ(f.find("qwen3.rope.dimension_count"), nullptr);
  EXPECT_EQ(f.find("qwen3.vocab_size"), nullptr);
  EXPECT_EQ(f.find("qwen3.rope.scaling.type"), nullptr);
  // The tokenizer helper's keys are there.
  ASSERT_NE(f.find("tokenizer.ggml.model"), nullptr);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  // The token list is padded to the embedding rows (config vocab_size 272; tokenizer.json has 261 tokens), as
  // llama.cpp's loader takes n_vocab from it and checks token_embd against it.
  const auto tokens = f.get("tokenizer.ggml.tokens").as_string_array();
  ASSERT_EQ(tokens.size(), 272u);
  EXPECT_EQ(tokens[258], "hell");
  EXPECT_EQ(tokens[259], "<|endoftext|>");
  EXPECT_EQ(tokens[271], "[PAD271]");
  const auto types = f.get("tokenizer.ggml.token_type").as_int_array();
  ASSERT_EQ(types.size(), 272u);
  EXPECT_EQ(types[271], 5);  // UNUSED

  expect_tensor_table(f, s, src);
  for (const auto& [g, h] : expected_names(s)) {
    const auto* t = f.find_tensor(g);
    const auto& st = src.at(h);
    if (st.shape.size() == 2) {
      // Matrices: bf16 bytes exactly as in the checkpoint; qwen3 is never permuted.
      EXPECT_EQ(t->type, DType::BF16) << g;
      ASSERT_EQ(t->nbytes, st.bytes.size()) << g;
      EXPECT_EQ(std::memcmp(f.tensor_data(*t), st.bytes.data(), st.bytes.size()), 0) << g;
    } else {
      EXPECT_EQ(gguf_values(f, *t), st.values) << g;  // bf16 -> f32 is exact
    }
  }
  // The unused rotary inv_freq was reported, not converted.
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
    return n.find("rotary_emb.inv_freq") != std::string::npos;
  }));
  EXPECT_GE(log.size(), f.tensors().size());  // one progress line per tensor
}

TEST(Convert, LlamaF32PermutesQAndKRowsAndKeepsValues) {
  TempDir tmp("llama_f32");
  Spec s;
  s.hf_arch = "LlamaForCausalLM";
  s.dtype = StDType::F32;
  s.head_dim = 16;  // n_head * head_dim = n_embd, as in real llama configs
  s.write_head_dim = false;
  s.attention_bias = true;
  s.rope_theta = 10000.0;
  const auto src = write_checkpoint(tmp / "hf", s);
  const auto r = convert(tmp / "hf", tmp / "out.gguf", OutType::F32);
  EXPECT_EQ(r.arch, "llama");

  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  expect_u32(f, "llama.block_count", 2);
  expect_u32(f, "llama.embedding_length", 64);
  expect_u32(f, "llama.attention.head_count", 4);
  expect_u32(f, "llama.attention.head_count_kv", 2);
  expect_u32(f, "llama.vocab_size", 272);
  expect_u32(f, "llama.rope.dimension_count", 16);
  expect_f32(f, "llama.rope.freq_base", 10000.0);
  expect_u32(f, "general.file_type", 0);
  // No head_dim in config.json: llama.cpp writes no key_length / value_length.
  EXPECT_EQ(f.find("llama.attention.key_length"), nullptr);
  EXPECT_EQ(f.find("llama.attention.value_length"), nullptr);
  EXPECT_EQ(f.find_tensor("rope_freqs.weight"), nullptr);

  expect_tensor_table(f, s, src);
  for (const auto& [g, h] : expected_names(s)) {
    const auto* t = f.find_tensor(g);
    EXPECT_EQ(t->type, DType::F32) << g;
    const auto& st = src.at(h);
    const auto got = gguf_values(f, *t);
    const bool is_q = g.find(".attn_q.") != std::string::npos, is_k = g.find(".attn_k.") != std::string::npos;
    if (is_q || is_k) {
      const auto want = llama_permute_reference(st, is_q ? s.n_head : s.n_head_kv);
      EXPECT_EQ(got, want) << g << " is not permuted as llama needs";
      EXPECT_NE(got, st.values) << g;  // (the permutation moved something)
    } else {
      EXPECT_EQ(got, st.values) << g;  // f32 values preserved exactly, v / o / ffn unpermuted
    }
  }
}

TEST(Convert, LlamaPermutationRowMapMatchesFacts) {
  // Facts B.5 in words: within each head of d rows, HF row r < d/2 goes to 2r and row d/2 + r to 2r + 1.
  const int64_t n_heads = 3, d = 8, rows = n_heads * d;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t r = 0; r < d / 2; ++r) {
      EXPECT_EQ(llama_permuted_source_row(h * d + 2 * r, rows, n_heads), h * d + r);
      EXPECT_EQ(llama_permuted_source_row(h * d + 2 * r + 1, rows, n_heads), h * d + d / 2 + r);
    }
}

TEST(Convert, TiedEmbeddingsHaveNoOutputTensor) {
  TempDir tmp("tied");
  Spec s;
  s.tied = true;
  const auto src = write_checkpoint(tmp / "hf", s);
  convert(tmp / "hf", tmp / "out.gguf", OutType::AUTO);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  expect_tensor_table(f, s, src);
  // auto on a bf16 checkpoint is bf16.
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, DType::BF16);
  expect_u32(f, "general.file_type", 32);
}

TEST(Convert, TiedConfigWithAnLmHeadInTheCheckpointIgnoresIt) {
  TempDir tmp("tied_extra");
  Spec s;  // the checkpoint has lm_head.weight, then config.json says tied
  write_checkpoint(tmp / "hf", s);
  Spec tied = s;
  tied.tied = true;
  write_text(tmp / "hf" / "config.json", config_of(tied).dump());
  const auto r = convert(tmp / "hf", tmp / "out.gguf", OutType::BF16);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
    return n.find("lm_head.weight") != std::string::npos;
  }));
}

TEST(Convert, F16FromBf16AndAutoFromF32) {
  TempDir tmp("f16");
  Spec s;
  s.tied = true;
  const auto src = write_checkpoint(tmp / "hf", s);
  convert(tmp / "hf", tmp / "out.gguf", OutType::F16);
  {
    const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
    expect_u32(f, "general.file_type", 1);
    const auto* t = f.find_tensor("blk.1.ffn_down.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, DType::F16);
    const auto& st = src.at("model.layers.1.mlp.down_proj.weight");
    const auto got = gguf_values(f, *t);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], fp16_to_fp32(fp32_to_fp16(st.values[i]))) << i;
  }
  // auto on an f32 checkpoint is f16, like llama.cpp's converter.
  Spec s32 = s;
  s32.dtype = StDType::F32;
  write_checkpoint(tmp / "hf32", s32);
  const auto r = convert(tmp / "hf32", tmp / "out32.gguf", OutType::AUTO);
  EXPECT_EQ(r.type, OutType::F16);
  const auto f = gguf::GgufFile::open((tmp / "out32.gguf").string());
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, DType::F16);
  EXPECT_EQ(f.find_tensor("blk.0.attn_norm.weight")->type, DType::F32);
}

TEST(Convert, ShardedCheckpointGivesTheSameFileAsASingleOne) {
  TempDir tmp("sharded");
  Spec s;
  write_checkpoint(tmp / "single", s);
  Spec sharded = s;
  sharded.shards = 3;
  write_checkpoint(tmp / "sharded", sharded);
  ASSERT_TRUE(fs::exists(tmp / "sharded" / "model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(tmp / "sharded" / "model.safetensors"));
  convert(tmp / "single", tmp / "a.gguf", OutType::BF16);
  convert(tmp / "sharded", tmp / "b.gguf", OutType::BF16);
  std::ifstream a(tmp / "a.gguf", std::ios::binary), b(tmp / "b.gguf", std::ios::binary);
  const std::string ab((std::istreambuf_iterator<char>(a)), {}), bb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_GT(ab.size(), 0u);
  EXPECT_TRUE(ab == bb) << "sharded and single-file conversions differ";
}

TEST(Convert, Llama3RopeScalingWritesRopeFreqs) {
  TempDir tmp("llama3");
  Spec s;
  s.hf_arch = "LlamaForCausalLM";
  s.head_dim = 16;
  s.rope_theta = 500000.0;
  s.rope_scaling = {{"rope_type", "llama3"},
                    {"factor", 8.0},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 8192}};
  const auto src = write_checkpoint(tmp / "hf", s);
  convert(tmp / "hf", tmp / "out.gguf", OutType::BF16);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  expect_tensor_table(f, s, src, {"rope_freqs.weight"});
  const auto* t = f.find_tensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, DType::F32);
  ASSERT_EQ(t->n_dims, 1u);
  ASSERT_EQ(t->ne[0], 8);  // n_rot / 2
  // By hand (facts B.6), base 500000, n_rot 16: wavelength_i = 2*pi*500000^(i/8) =
  // 6.28, 32.4, 167.1, 861.6 (< 8192/4 -> 1), 4442.9 (between: s = (8192/4442.88 - 1)/3 = 0.281283,
  // 1/((1-s)/8 + s) = 2.694530), 22910.6, 118142.8, 609226.3 (> 8192/1 -> 8).
  const float want[8] = {1, 1, 1, 1, 2.6945296878947333f, 8, 8, 8};
  const auto got = gguf_values(f, *t);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got[size_t(i)], want[i], 1e-6 * want[i]) << i;
  // llama3 scaling writes no rope.scaling keys (the factors live in the tensor).
  EXPECT_EQ(f.find("llama.rope.scaling.type"), nullptr);
}

TEST(Convert, LinearAndYarnRopeScalingKeys) {
  Spec s;
  s.rope_scaling = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto hp = parse_hf_config(config_of(s).dump(), "config.json");
  gguf::GgufWriter w;
  add_hparams_metadata(hp, w);
  auto bytes = w.write_to_memory();
  auto f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(f.get_string("qwen3.rope.scaling.type"), "yarn");
  expect_f32(f, "qwen3.rope.scaling.factor", 4.0);
  expect_u32(f, "qwen3.rope.scaling.original_context_length", 32768);

  s.hf_arch = "LlamaForCausalLM";
  s.rope_scaling = {{"type", "linear"}, {"factor", 2.0}};  // legacy "type" key
  hp = parse_hf_config(config_of(s).dump(), "config.json");
  gguf::GgufWriter w2;
  add_hparams_metadata(hp, w2);
  bytes = w2.write_to_memory();
  f = gguf::GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(f.get_string("llama.rope.scaling.type"), "linear");
  expect_f32(f, "llama.rope.scaling.factor", 2.0);
  EXPECT_EQ(f.find("llama.rope.scaling.original_context_length"), nullptr);

  // rope_type "default" is no scaling.
  s.rope_scaling = {{"rope_type", "default"}};
  EXPECT_EQ(parse_hf_config(config_of(s).dump(), "config.json").rope_scaling.type, "");
}

TEST(Convert, Q8_0QuantizesMatricesAndKeepsNormsF32) {
  TempDir tmp("q8_0");
  Spec s;
  const auto src = write_checkpoint(tmp / "hf", s);
  convert(tmp / "hf", tmp / "out.gguf", OutType::Q8_0);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  expect_u32(f, "general.file_type", 7);
  expect_tensor_table(f, s, src);
  for (const auto& [g, h] : expected_names(s)) {
    const auto* t = f.find_tensor(g);
    const auto& st = src.at(h);
    const auto got = gguf_values(f, *t);
    if (st.shape.size() == 2) {
      EXPECT_EQ(t->type, DType::Q8_0) << g;
      // q8_0 on N(0,1) data: step max|x|/127 over 32 values, about 0.5% rms; bound 1%.
      EXPECT_LT(rel_rms(st.values, got), 0.01) << g;
    } else {
      EXPECT_EQ(got, st.values) << g;
    }
  }
}

TEST(Convert, Q4KMRecipeLayers) {
  // Q6_K for attn_v / ffn_down in the first and last eighth of the layers and every third layer between
  // (llama.cpp's use_more_bits), Q4_K elsewhere; listed by hand for 8 and 32 layers.
  auto type_of = [](const std::string& name, int layer, int64_t n_layer, bool has_output) {
    PlannedTensor t{name, "", {256, 256}, 0, layer};
    return tensor_type_for(OutType::Q4_K_M, t, n_layer, has_output);
  };
  const std::set<int> heavy8 = {0, 3, 6, 7};
  const std::set<int> heavy32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  for (int i = 0; i < 8; ++i) {
    const DType want = heavy8.count(i) ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(type_of("blk." + std::to_string(i) + ".attn_v.weight", i, 8, true), want) << i;
    EXPECT_EQ(type_of("blk." + std::to_string(i) + ".ffn_down.weight", i, 8, true), want) << i;
    EXPECT_EQ(type_of("blk." + std::to_string(i) + ".attn_k.weight", i, 8, true), DType::Q4_K) << i;
  }
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(type_of("blk." + std::to_string(i) + ".ffn_down.weight", i, 32, true),
              heavy32.count(i) ? DType::Q6_K : DType::Q4_K)
        << i;
  EXPECT_EQ(type_of("output.weight", -1, 8, true), DType::Q6_K);
  EXPECT_EQ(type_of("token_embd.weight", -1, 8, true), DType::Q4_K);
  EXPECT_EQ(type_of("token_embd.weight", -1, 8, false), DType::Q6_K);  // tied: the embeddings are the head
  PlannedTensor v3{"blk.3.attn_v.weight", "", {256, 256}, 0, 3},
      v4{"blk.4.attn_v.weight", "", {256, 256}, 0, 4};
  EXPECT_EQ(tensor_type_for(OutType::Q5_K_M, v3, 8, true), DType::Q6_K);
  EXPECT_EQ(tensor_type_for(OutType::Q5_K_M, v4, 8, true), DType::Q5_K);
  EXPECT_EQ(file_type_of(OutType::Q5_K_M), 17u);
  PlannedTensor norm{"blk.0.attn_norm.weight", "", {256}, 0, 0};
  EXPECT_EQ(tensor_type_for(OutType::Q4_K_M, norm, 8, true), DType::F32);
}

TEST(Convert, Q4KMConvertsWithTheMixedRecipe) {
  TempDir tmp("q4_k_m");
  Spec s;  // K-quants need rows that are multiples of 256
  s.n_embd = 256;
  s.n_ff = 256;
  s.n_head = 4;
  s.n_head_kv = 1;
  s.head_dim = 64;
  const auto src = write_checkpoint(tmp / "hf", s);
  convert(tmp / "hf", tmp / "out.gguf", OutType::Q4_K_M);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  expect_u32(f, "general.file_type", 15);
  expect_u32(f, "general.quantization_version", 2);
  expect_tensor_table(f, s, src);
  // With 2 layers, layer 1 is in the last eighth (Q6_K for attn_v / ffn_down) and layer 0 is not.
  EXPECT_EQ(f.find_tensor("output.weight")->type, DType::Q6_K);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.find_tensor("blk.0.attn_v.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.find_tensor("blk.1.attn_v.weight")->type, DType::Q6_K);
  EXPECT_EQ(f.find_tensor("blk.1.ffn_down.weight")->type, DType::Q6_K);
  EXPECT_EQ(f.find_tensor("blk.1.attn_q.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.find_tensor("blk.1.attn_norm.weight")->type, DType::F32);
  for (const auto& [g, h] : expected_names(s)) {
    const auto* t = f.find_tensor(g);
    const auto& st = src.at(h);
    const double err = rel_rms(st.values, gguf_values(f, *t));
    if (t->type == DType::Q4_K) {
      EXPECT_LT(err, 0.12) << g;  // 4-bit on N(0,1): ~0.08-0.10
    } else if (t->type == DType::Q6_K) {
      EXPECT_LT(err, 0.03) << g;  // 6-bit: ~0.02
    } else {
      EXPECT_EQ(err, 0.0) << g;
    }
  }
}

TEST(Convert, KQuantFallsBackWhenRowsAreNotBlockMultiples) {
  TempDir tmp("fallback");
  Spec s;  // n_embd 64: no matrix row is a multiple of 256
  s.tied = true;
  write_checkpoint(tmp / "hf", s);
  const auto r = convert(tmp / "hf", tmp / "out.gguf", OutType::Q4_K);
  const auto f = gguf::GgufFile::open((tmp / "out.gguf").string());
  expect_u32(f, "general.file_type", 14);
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, DType::Q8_0);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::Q8_0);  // n_ff 96 = 3 x 32
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
    return n.find("stored as q8_0") != std::string::npos;
  }));
}

TEST(Convert, VocabOnlyWritesTokenizerAndNoTensors) {
  TempDir tmp("vocab");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  ConvertOptions o;
  o.hf_dir = tmp / "hf";
  o.output = tmp / "vocab.gguf";
  o.vocab_only = true;
  const auto r = convert_hf_to_gguf(o);
  EXPECT_EQ(r.arch, "qwen3");
  {
    const auto f = gguf::GgufFile::open(o.output.string());
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
    EXPECT_EQ(f.get_string("general.name"), "hf");  // the directory name
    EXPECT_NE(f.find("tokenizer.ggml.tokens"), nullptr);
    EXPECT_EQ(f.find("qwen3.block_count"), nullptr);
  }
  // Only tokenizer.json is needed.
  fs::create_directories(tmp / "tok");
  fs::copy_file(tmp / "hf" / "tokenizer.json", tmp / "tok" / "tokenizer.json");
  o.hf_dir = tmp / "tok";
  o.output = tmp / "vocab2.gguf";
  EXPECT_EQ(convert_hf_to_gguf(o).arch, "llama");
  const auto f = gguf::GgufFile::open(o.output.string());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
}

// ---- bad input: clear errors and no output file ----------------------------------------------------------

// Runs the library converter and the CLI on dir; both must fail with a message containing every part and
// leave neither the output nor its temporary behind.
void expect_convert_fails(const fs::path& dir, const fs::path& out, const std::vector<std::string>& parts,
                          const std::string& type = "bf16") {
  try {
    convert(dir, out, *out_type_from_name(type));
    ADD_FAILURE() << "conversion of " << dir << " succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
  EXPECT_FALSE(fs::exists(out)) << "output left behind";
  EXPECT_FALSE(fs::exists(out.string() + ".tmp")) << "temporary output left behind";

  const fs::path err = out.string() + ".stderr";
  const std::string cmd = std::string(TANDEM_BIN) + " convert '" + dir.string() + "' -o '" + out.string() +
                          "' --type " + type + " -q 2> '" + err.string() + "' > /dev/null";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0) << cmd;
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("error: "), std::string::npos) << text;
  for (const auto& p : parts)
    EXPECT_NE(text.find(p), std::string::npos) << "stderr: " << text << "\nmissing: " << p;
  EXPECT_FALSE(fs::exists(out)) << "CLI left output behind";
  EXPECT_FALSE(fs::exists(out.string() + ".tmp")) << "CLI left temporary output behind";
}

TEST(ConvertErrors, UnknownArchitectureListsSupportedOnes) {
  TempDir tmp("err_arch");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  json c = config_of(s);
  c["architectures"] = {"GPT2LMHeadModel"};
  write_text(tmp / "hf" / "config.json", c.dump());
  expect_convert_fails(
      tmp / "hf", tmp / "out.gguf",
      {"unsupported architecture 'GPT2LMHeadModel'", "LlamaForCausalLM", "Qwen3ForCausalLM"});
}

TEST(ConvertErrors, MissingTensorIsNamed) {
  TempDir tmp("err_missing");
  Spec s;
  const auto src = write_checkpoint(tmp / "hf", s);
  SafetensorsWriter w;
  for (const auto& [name, t] : src)
    if (name != "model.layers.1.mlp.up_proj.weight") w.add(name, s.dtype, t.shape, t.bytes);
  w.write(tmp / "hf" / "model.safetensors");
  expect_convert_fails(tmp / "hf", tmp / "out.gguf",
                       {"missing 1 tensor", "model.layers.1.mlp.up_proj.weight"});
}

TEST(ConvertErrors, MissingLmHeadOfAnUntiedModelSaysSo) {
  TempDir tmp("err_lm_head");
  Spec s;
  const auto src = write_checkpoint(tmp / "hf", s);
  SafetensorsWriter w;
  for (const auto& [name, t] : src)
    if (name != "lm_head.weight") w.add(name, s.dtype, t.shape, t.bytes);
  w.write(tmp / "hf" / "model.safetensors");
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"lm_head.weight", "tie_word_embeddings"});
}

TEST(ConvertErrors, WrongShapeNamesTensorAndBothShapes) {
  TempDir tmp("err_shape");
  Spec s;
  const auto src = write_checkpoint(tmp / "hf", s);
  SafetensorsWriter w;
  for (const auto& [name, t] : src) {
    if (name == "model.layers.0.self_attn.k_proj.weight") {
      w.add_bf16(name, {32, 64}, std::vector<float>(32 * 64, 0.25f));  // config implies [64, 64]
    } else {
      w.add(name, s.dtype, t.shape, t.bytes);
    }
  }
  w.write(tmp / "hf" / "model.safetensors");
  expect_convert_fails(tmp / "hf", tmp / "out.gguf",
                       {"model.layers.0.self_attn.k_proj.weight", "[32, 64]", "[64, 64]"});
}

TEST(ConvertErrors, CorruptSafetensorsHeader) {
  TempDir tmp("err_header");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  {
    std::fstream f(tmp / "hf" / "model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
    const uint64_t huge = uint64_t(1) << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"model.safetensors", "corrupt safetensors header"});

  // Valid length, garbage JSON.
  write_checkpoint(tmp / "hf2", s);
  {
    std::fstream f(tmp / "hf2" / "model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(9);  // just after the opening brace
    f.write("!!!!", 4);
  }
  expect_convert_fails(tmp / "hf2", tmp / "out2.gguf", {"model.safetensors", "invalid JSON"});
}

TEST(ConvertErrors, MissingConfigJson) {
  TempDir tmp("err_config");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  fs::remove(tmp / "hf" / "config.json");
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"config.json not found"});
}

TEST(ConvertErrors, MissingDirectoryAndUnsupportedRopeScaling) {
  TempDir tmp("err_misc");
  expect_convert_fails(tmp / "nope", tmp / "out.gguf", {"not a directory"});
  Spec s;
  s.rope_scaling = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  write_checkpoint(tmp / "hf", s);
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"rope_scaling type 'dynamic' is not supported"});
}

TEST(ConvertErrors, FailureWhileWritingLeavesNoFile) {
  // A bf16 value beyond the f16 range is found only while the tensor is produced, after the output was
  // opened.
  TempDir tmp("err_midwrite");
  Spec s;
  const auto src = write_checkpoint(tmp / "hf", s);
  SafetensorsWriter w;
  for (const auto& [name, t] : src) {
    if (name == "model.layers.1.mlp.down_proj.weight") {
      std::vector<float> v = t.values;
      v[17] = 1.0e6f;
      w.add_bf16(name, t.shape, v);
    } else {
      w.add(name, s.dtype, t.shape, t.bytes);
    }
  }
  w.write(tmp / "hf" / "model.safetensors");
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"model.layers.1.mlp.down_proj.weight", "f16 range"},
                       "f16");
  // bf16 keeps it.
  convert(tmp / "hf", tmp / "ok.gguf", OutType::BF16);
  EXPECT_TRUE(fs::exists(tmp / "ok.gguf"));
}

TEST(ConvertErrors, MoreTokensThanEmbeddingRows) {
  TempDir tmp("err_vocab");
  Spec s;
  s.n_vocab = 200;  // tokenizer.json has 261 tokens
  write_checkpoint(tmp / "hf", s);
  expect_convert_fails(tmp / "hf", tmp / "out.gguf", {"tokenizer.json has 261 tokens", "200"});
}

TEST(ConvertErrors, OutputOverAnInputIsRefused) {
  TempDir tmp("err_overwrite");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  const auto before = fs::file_size(tmp / "hf" / "model.safetensors");
  EXPECT_THROW(convert(tmp / "hf", tmp / "hf" / "model.safetensors", OutType::BF16), Error);
  EXPECT_THROW(convert(tmp / "hf", tmp / "hf" / "config.json", OutType::BF16), Error);
  EXPECT_EQ(fs::file_size(tmp / "hf" / "model.safetensors"), before);
  EXPECT_THROW(convert(tmp / "hf", tmp / "no_such_dir" / "out.gguf", OutType::BF16), Error);
}

// Any file convert may read is refused as the output, by whatever path it is reached: a hard link outside the
// checkpoint, a shard or generation_config.json (not in the old fixed list of names), a file of the DFlash
// target directory. Before: the hard link and the unlisted names were overwritten.
TEST(ConvertErrors, OutputOverAnyInputFileIsRefused) {
  TempDir tmp("err_overwrite_any");
  Spec s;
  write_checkpoint(tmp / "hf", s);
  { std::ofstream(tmp / "hf" / "generation_config.json") << "{\"max_new_tokens\": 8}"; }
  fs::copy_file(tmp / "hf" / "model.safetensors", tmp / "hf" / "model-00002-of-00002.safetensors");
  fs::create_hard_link(tmp / "hf" / "model.safetensors", tmp / "weights_link.gguf");
  fs::create_directories(tmp / "target");
  { std::ofstream(tmp / "target" / "tokenizer.json") << "{}"; }
  const auto size_of = [&](const fs::path& p) { return fs::file_size(p); };
  const auto before = size_of(tmp / "hf" / "model.safetensors");
  const auto expect_refused = [&](const fs::path& out, const fs::path& target_dir = {}) {
    ConvertOptions o;
    o.hf_dir = tmp / "hf";
    o.output = out;
    o.type = OutType::BF16;
    o.target_model_dir = target_dir;
    try {
      convert_hf_to_gguf(o);
      ADD_FAILURE() << out << " was written";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("an input of the conversion"), std::string::npos) << e.what();
    }
  };
  expect_refused(tmp / "weights_link.gguf");
  expect_refused(tmp / "hf" / "generation_config.json");
  expect_refused(tmp / "hf" / "model-00002-of-00002.safetensors");
  expect_refused(tmp / "target" / "tokenizer.json", tmp / "target");
  EXPECT_EQ(size_of(tmp / "hf" / "model.safetensors"), before);
  EXPECT_EQ(size_of(tmp / "hf" / "model-00002-of-00002.safetensors"), before);
  EXPECT_EQ(size_of(tmp / "target" / "tokenizer.json"), 2u);
  // an output file beside the checkpoint that is none of its inputs is fine
  fs::remove(tmp / "hf" / "model-00002-of-00002.safetensors");
  { std::ofstream(tmp / "hf" / "old.gguf") << "x"; }
  EXPECT_NO_THROW(convert(tmp / "hf", tmp / "hf" / "old.gguf", OutType::BF16));
}

TEST(ConvertErrors, BadConfigValues) {
  Spec s;
  json c = config_of(s);
  c.erase("hidden_size");
  EXPECT_THROW(parse_hf_config(c.dump(), "config.json"), Error);
  c = config_of(s);
  c["num_key_value_heads"] = 3;  // 4 heads are not a multiple of 3
  EXPECT_THROW(parse_hf_config(c.dump(), "config.json"), Error);
  c = config_of(s);
  c["num_attention_heads"] = -4;
  EXPECT_THROW(parse_hf_config(c.dump(), "config.json"), Error);
  c = config_of(s);
  c.erase("architectures");
  EXPECT_THROW(parse_hf_config(c.dump(), "config.json"), Error);
  EXPECT_THROW(parse_hf_config("{not json", "config.json"), Error);
  // llama3 scaling on a qwen3 model is not something llama.cpp converts.
  c = config_of(s);
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_THROW(parse_hf_config(c.dump(), "config.json"), Error);
}

// A hyperparameter too large for GGUF's uint32 names the config.json key it came from.
TEST(ConvertErrors, HyperparameterOverflowNamesTheConfigKey) {
  Spec s;
  json c = config_of(s);
  c["max_position_embeddings"] = 5000000000LL;
  const ModelHparams hp = parse_hf_config(c.dump(), "config.json");
  gguf::GgufWriter w;
  try {
    add_hparams_metadata(hp, w);
    FAIL() << "no error for a context length of 5e9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: max_position_embeddings = 5000000000 does not fit"),
              std::string::npos)
        << e.what();
  }
}

// ---- the command line ------------------------------------------------------------------------------------

TEST(ConvertCli, EndToEndQ8_0) {
  TempDir tmp("cli");
  Spec s;
  s.hf_arch = "LlamaForCausalLM";
  s.head_dim = 16;
  const auto src = write_checkpoint(tmp / "hf", s);
  const fs::path out = tmp / "cli.gguf";
  const std::string cmd = std::string(TANDEM_BIN) + " convert '" + (tmp / "hf").string() + "' -o '" +
                          out.string() + "' --type q8_0 --threads 2 --name cli-model 2> '" +
                          (tmp / "log").string() + "' > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream log(tmp / "log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("blk.0.attn_q.weight"), std::string::npos) << text;  // progress lines

  const auto f = gguf::GgufFile::open(out.string());
  EXPECT_EQ(f.get_string("general.name"), "cli-model");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  expect_u32(f, "general.file_type", 7);
  expect_tensor_table(f, s, src);
  const auto* q = f.find_tensor("blk.1.attn_q.weight");
  EXPECT_EQ(q->type, DType::Q8_0);
  const auto want = llama_permute_reference(src.at("model.layers.1.self_attn.q_proj.weight"), s.n_head);
  EXPECT_LT(rel_rms(want, gguf_values(f, *q)), 0.01);

  // A bad --type is a clear error too.
  const std::string bad = std::string(TANDEM_BIN) + " convert '" + (tmp / "hf").string() + "' -o '" +
                          (tmp / "bad.gguf").string() + "' --type q3_k 2> '" + (tmp / "err").string() + "'";
  const int status = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  std::ifstream err(tmp / "err");
  const std::string etext((std::istreambuf_iterator<char>(err)), {});
  EXPECT_NE(etext.find("q3_k"), std::string::npos) << etext;
  EXPECT_FALSE(fs::exists(tmp / "bad.gguf"));
}

}  // namespace
}  // namespace tandem::convert
