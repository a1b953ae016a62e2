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
  float fc_scale = 0.0f;  // > 0: write fc.scale (one value)
  bool own_embeddings = false;  // write token_embd / output of n_vocab_own rows
  int64_t n_vocab_own = 0;
  float eps = 1e-6f;
  uint64_t seed = 7;
};

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
  auto W = [&](const std::string& name) -> const std::vector<float>& { return d.m.w.at(name); };
  auto matvec = [](const std::vector<float>& w, const std::vector<double>& x, int64_t out) {
    const int64_t in = int64_t(x.size());
    std::vector<double> y(size_t(out), 0.0);
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(w[size_t(o * in + i)]) * x[size_t(i)];
      y[size_t(o)] = s;
    }
    return y;
  };
  auto rms = [&](const std::vector<double>& x, const std::vector<float>& g, int64_t off, int64_t len) {
    double ss = 0;
    for (int64_t i = 0; i < len; ++i) ss += x[size_t(off + i)] * x[size_t(off + i)];
    const double inv = 1.0 / std::sqrt(ss / double(len) + double(c.eps));
    std::vector<double> y(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) y[size_t(i)] = x[size_t(off + i)] * inv * g[size_t(i)];
    return y;
  };
  auto head_norm = [&](std::vector<double>& v, int64_t n_heads, const std::vector<float>& g) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const auto r = rms(v, g, h * hd, hd);
      std::copy(r.begin(), r.end(), v.begin() + h * hd);
    }
  };
  auto rope = [&](std::vector<double>& v, int64_t n_heads, int64_t pos) {  // NEOX
    for (int64_t h = 0; h < n_heads; ++h) {
      double* x = v.data() + h * hd;
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double theta = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(hd));
        const double cs = std::cos(theta), sn = std::sin(theta), x0 = x[i], x1 = x[i + hd / 2];
        x[i] = x0 * cs - x1 * sn;
        x[i + hd / 2] = x0 * sn + x1 * cs;
      }
    }
  };
  // Context: g = RMS(fc . [h(l0) | h(l1) | ...]) . enc_norm per position.
  std::vector<std::vector<double>> g(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {
    std::vector<double> feat;
    for (int32_t l : c.target_layers) feat.insert(feat.end(), hidden[size_t(l)][size_t(p)].begin(),
                                                  hidden[size_t(l)][size_t(p)].end());
    std::vector<double> u = matvec(W("fc.weight"), feat, E);
    if (c.fc_scale > 0)
      for (double& v : u) v *= double(c.fc_scale);
    g[size_t(p)] = rms(u, W("enc.output_norm.weight"), 0, E);
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
    std::vector<std::vector<double>> K, V;
    for (int64_t p = 0; p < P; ++p) {  // injected context: no attention norm before the projections
      std::vector<double> k = matvec(wk, g[size_t(p)], HKV * hd);
      head_norm(k, HKV, W(blk_name(l, "attn_k_norm.weight")));
      rope(k, HKV, p);
      K.push_back(k);
      V.push_back(matvec(wv, g[size_t(p)], HKV * hd));
    }
    std::vector<std::vector<double>> Q;
    for (int64_t b = 0; b < B; ++b) {
      const auto h = rms(x[size_t(b)], W(blk_name(l, "attn_norm.weight")), 0, E);
      std::vector<double> q = matvec(W(blk_name(l, "attn_q.weight")), h, H * hd);
      std::vector<double> k = matvec(wk, h, HKV * hd);
      head_norm(q, H, W(blk_name(l, "attn_q_norm.weight")));
      head_norm(k, HKV, W(blk_name(l, "attn_k_norm.weight")));
      rope(q, H, P + b);
      rope(k, HKV, P + b);
      Q.push_back(q);
      K.push_back(k);
      V.push_back(matvec(wv, h, HKV * hd));
    }
    for (int64_t b = 0; b < B; ++b) {  // every context position and every block row: non-causal
      std::vector<double> att(size_t(H * hd), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kvh = hh / (H / HKV);
        std::vector<double> s(K.size());
        double mx = -1e300;
        for (size_t j = 0; j < K.size(); ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += Q[size_t(b)][size_t(hh * hd + i)] * K[j][size_t(kvh * hd + i)];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (size_t j = 0; j < K.size(); ++j)
          for (int64_t i = 0; i < hd; ++i) att[size_t(hh * hd + i)] += s[j] / z * V[j][size_t(kvh * hd + i)];
      }
      const auto o = matvec(W(blk_name(l, "attn_output.weight")), att, E);
      for (int64_t i = 0; i < E; ++i) x[size_t(b)][size_t(i)] += o[size_t(i)];
    }
    for (int64_t b = 0; b < B; ++b) {
      const auto h = rms(x[size_t(b)], W(blk_name(l, "ffn_norm.weight")), 0, E);
      const auto ga = matvec(W(blk_name(l, "ffn_gate.weight")), h, c.n_ff);
      const auto up = matvec(W(blk_name(l, "ffn_up.weight")), h, c.n_ff);
      std::vector<double> a(static_cast<size_t>(c.n_ff));
      for (int64_t i = 0; i < c.n_ff; ++i) a[size_t(i)] = ga[size_t(i)] / (1 + std::exp(-ga[size_t(i)])) * up[size_t(i)];
      const auto dn = matvec(W(blk_name(l, "ffn_down.weight")), a, E);
      for (int64_t i = 0; i < E; ++i) x[size_t(b)][size_t(i)] += dn[size_t(i)];
    }
  }
  const TinyConfig& tc = target.cfg;
  const std::vector<float> head =
      c.own_embeddings ? W("output.weight") : target.w.at(tc.tied ? "token_embd.weight" : "output.weight");
  const int64_t n_vocab = int64_t(head.size()) / E;
  std::vector<std::vector<double>> logits;
  for (int64_t b = 1; b < B; ++b) {
    const auto h = rms(x[size_t(b)], W("output_norm.weight"), 0, E);
    logits.push_back(matvec(head, h, n_vocab));
  }
  return logits;
}

}  // namespace tandem::testing
