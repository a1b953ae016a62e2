// Tiny random DFlash drafters for tests: weights, a GGUF writer (keys of GGUF-ARCH-FACTS E.1), and a plain
// double-precision reference of the drafter's forward (E.3, written from the description, independent of
// Ops): K/V of the context from the fused target features, then one non-causal block.
#pragma once

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "test_model_fixture.h"

namespace tandem::testing {

struct TinyDflashConfig {
  int64_t n_embd = 64;  // must equal the target's (a test of the error sets it otherwise)
  int64_t n_layer = 1;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 16;
  int64_t n_ff = 96;
  std::vector<int32_t> target_layers = {1, 2};
  int32_t block_size = 8;
  int32_t mask_token_id = 5;
  float fc_scale = 0.0f;        // > 0: write fc.scale (one value)
  bool own_embeddings = false;  // write token_embd / output of n_vocab_own rows
  int64_t n_vocab_own = 0;
  float eps = 1e-6f;
  uint64_t seed = 7;
};

// A random drafter of the shipped small model's width: 512 wide, 8 heads of 64 (4 KV), taps of layers 1, 4, 7,
// block 8, mask token 1. Tests start from it and change one thing.
inline TinyDflashConfig shipped_shape_dflash_config() {
  TinyDflashConfig dc;
  dc.n_embd = 512;
  dc.n_head = 8;
  dc.n_head_kv = 4;
  dc.head_dim = 64;
  dc.n_ff = 256;
  dc.target_layers = {1, 4, 7};
  dc.block_size = 8;
  dc.mask_token_id = 1;
  return dc;
}

struct TinyDflash {
  TinyDflashConfig cfg;
  TinyModel m;  // weights in the same container as the target's tiny models
};

inline TinyDflash make_tiny_dflash(const TinyDflashConfig& c) {
  TinyConfig tc;
  tc.arch = "qwen3";  // the same per-layer tensors as qwen3
  tc.n_vocab = c.own_embeddings ? c.n_vocab_own : 16;
  tc.n_embd = c.n_embd;
  tc.n_layer = c.n_layer;
  tc.n_head = c.n_head;
  tc.n_head_kv = c.n_head_kv;
  tc.head_dim = c.head_dim;
  tc.n_ff = c.n_ff;
  tc.eps = c.eps;
  tc.seed = c.seed;
  TinyDflash d{c, make_tiny(tc)};
  d.m.cfg.arch = "dflash";
  if (!c.own_embeddings) {
    d.m.w.erase("token_embd.weight");
    d.m.ne.erase("token_embd.weight");
    d.m.w.erase("output.weight");
    d.m.ne.erase("output.weight");
  }
  Rng rng(c.seed + 100);
  const int64_t F = int64_t(c.target_layers.size()) * c.n_embd;
  std::vector<float> fc(size_t(F * c.n_embd));
  for (float& v : fc) v = float((rng.uniform() * 2 - 1) * 2.0 / std::sqrt(double(F)));
  d.m.w["fc.weight"] = fc;
  d.m.ne["fc.weight"] = {F, c.n_embd};
  std::vector<float> en(size_t(c.n_embd));
  for (float& v : en) v = float(1.0 + (rng.uniform() * 2 - 1) * 0.3);
  d.m.w["enc.output_norm.weight"] = en;
  d.m.ne["enc.output_norm.weight"] = {c.n_embd};
  if (c.fc_scale > 0) {
    d.m.w["fc.scale"] = {c.fc_scale};
    d.m.ne["fc.scale"] = {1};
  }
  return d;
}

inline void write_tiny_dflash(const TinyDflash& d, const std::filesystem::path& path, WriteOptions o = {}) {
  using gguf::Value;
  if (!o.skip_keys.count("dflash.block_size"))
    o.extra_keys.emplace("dflash.block_size", Value::u32(uint32_t(d.cfg.block_size)));
  if (!o.skip_keys.count("dflash.target_layers"))
    o.extra_keys.emplace("dflash.target_layers", Value::i32_array(d.cfg.target_layers));
  if (!o.skip_keys.count("tokenizer.ggml.mask_token_id"))
    o.extra_keys.emplace("tokenizer.ggml.mask_token_id", Value::u32(uint32_t(d.cfg.mask_token_id)));
  write_tiny_gguf(d.m, path, o);
}

// The drafter's logits for a block [last, mask x n] at positions P .. P + n, given the target's layer inputs
// hidden[layer][position] (reference_forward) for the P context positions and the target's embedding and
// head. Returns logits of block rows 1 .. n.
inline std::vector<std::vector<double>> reference_dflash_block(
    const TinyDflash& d, const TinyModel& target, const std::vector<std::vector<std::vector<double>>>& hidden,
    int64_t P, int32_t last, int32_t n) {
  const TinyDflashConfig& c = d.cfg;
  const int64_t E = c.n_embd, hd = c.head_dim, H = c.n_head, HKV = c.n_head_kv;
  const double eps = double(c.eps), base = 10000.0;
  auto W = [&](const std::string& name) -> const std::vector<float>& { return d.m.w.at(name); };
  // Context: g = RMS(fc . [h(l0) | h(l1) | ...]) . enc_norm per position.
  std::vector<std::vector<double>> g(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {
    std::vector<double> feat;
    for (int32_t l : c.target_layers)
      feat.insert(feat.end(), hidden[size_t(l)][size_t(p)].begin(), hidden[size_t(l)][size_t(p)].end());
    std::vector<double> u = ref_matvec(W("fc.weight"), feat, E);
    if (c.fc_scale > 0)
      for (double& v : u) v *= double(c.fc_scale);
    g[size_t(p)] = ref_rms(u, W("enc.output_norm.weight"), 0, E, eps);
  }
  const int64_t B = int64_t(n) + 1;
  const std::vector<float> emb = c.own_embeddings ? W("token_embd.weight") : target.w.at("token_embd.weight");
  std::vector<std::vector<double>> x(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t = b == 0 ? last : c.mask_token_id;
    x[size_t(b)].assign(emb.begin() + t * E, emb.begin() + (t + 1) * E);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    // Copies: a reference bound to W(temporary name) trips GCC 13's -Wdangling-reference.
    const std::vector<float> wk = W(blk_name(l, "attn_k.weight"));
    const std::vector<float> wv = W(blk_name(l, "attn_v.weight"));
    const std::vector<float> k_norm = W(blk_name(l, "attn_k_norm.weight"));
    std::vector<std::vector<double>> K, V;
    for (int64_t p = 0; p < P; ++p) {  // injected context: no attention norm before the projections
      std::vector<double> k = ref_matvec(wk, g[size_t(p)], HKV * hd);
      ref_head_norm(k, HKV, hd, k_norm, eps);
      ref_rope(k, HKV, hd, p, base, true);
      K.push_back(k);
      V.push_back(ref_matvec(wv, g[size_t(p)], HKV * hd));
    }
    std::vector<std::vector<double>> Q;
    for (int64_t b = 0; b < B; ++b) {
      const auto h = ref_rms(x[size_t(b)], W(blk_name(l, "attn_norm.weight")), 0, E, eps);
      std::vector<double> q = ref_matvec(W(blk_name(l, "attn_q.weight")), h, H * hd);
      std::vector<double> k = ref_matvec(wk, h, HKV * hd);
      ref_head_norm(q, H, hd, W(blk_name(l, "attn_q_norm.weight")), eps);
      ref_head_norm(k, HKV, hd, k_norm, eps);
      ref_rope(q, H, hd, P + b, base, true);
      ref_rope(k, HKV, hd, P + b, base, true);
      Q.push_back(q);
      K.push_back(k);
      V.push_back(ref_matvec(wv, h, HKV * hd));
    }
    for (int64_t b = 0; b < B; ++b) {  // every context position and every block row: non-causal
      const auto att = ref_attend(Q[size_t(b)], K, V, K.size(), H, HKV, hd);
      const auto o = ref_matvec(W(blk_name(l, "attn_output.weight")), att, E);
      for (int64_t i = 0; i < E; ++i) x[size_t(b)][size_t(i)] += o[size_t(i)];
    }
    for (int64_t b = 0; b < B; ++b)
      ref_swiglu_block(x[size_t(b)], W(blk_name(l, "ffn_norm.weight")), W(blk_name(l, "ffn_gate.weight")),
                       W(blk_name(l, "ffn_up.weight")), W(blk_name(l, "ffn_down.weight")), c.n_ff, eps);
  }
  const TinyConfig& tc = target.cfg;
  const std::vector<float> head =
      c.own_embeddings ? W("output.weight") : target.w.at(tc.tied ? "token_embd.weight" : "output.weight");
  const int64_t n_vocab = int64_t(head.size()) / E;
  std::vector<std::vector<double>> logits;
  for (int64_t b = 1; b < B; ++b) {
    const auto h = ref_rms(x[size_t(b)], W("output_norm.weight"), 0, E, eps);
    logits.push_back(ref_matvec(head, h, n_vocab));
  }
  return logits;
}

}  // namespace tandem::testing
