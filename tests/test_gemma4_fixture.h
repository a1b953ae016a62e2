// A tiny random gemma4 model for tests (GGUF-ARCH-FACTS C): its weights, a GGUF writer, a double-precision
// reference forward written from C.3/C.4/C.6 independently of Ops, and a Session runner. Used by
// tests/test_gemma4.cpp (CPU, splits over cpu ranks) and tests/gpu/test_gpu_gemma4.cpp (CUDA).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/rng.h"
#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem::g4test {

using gguf::Value;

// Layers: 0 sliding, 1 sliding, 2 global (no attn_v), 3 sliding.
struct G4Config {
  int64_t n_vocab = 96, n_embd = 64, n_layer = 4, n_head = 4;
  int64_t hd_swa = 16, n_rot_swa = 8, n_kv_swa = 2;  // partial rope on sliding layers
  int64_t hd_global = 32, n_kv_global = 1;
  double prf_global = 0.25;  // rope_freqs: the first hd_global * prf / 2 factors are 1, the rest 1e30
  std::vector<bool> sliding = {true, true, false, true};
  std::vector<int64_t> n_ff = {96, 128, 96, 64};
  int32_t window = 4;
  float base = 1e6f, base_swa = 1e4f;
  float softcap = 0.0f;
  float eps = 1e-6f;
  // Mixture of experts (C.5) in every layer when n_expert > 0: fused gate_up experts or separate gate/up.
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  bool fused_gate_up = true;
  bool down_scale = true;  // ffn_down_exps.scale present
  // E2B/E4B (C.7): per-layer inputs of n_embd_pl values per layer (0 = none); the last n_shared_kv layers
  // read the K/V of an earlier layer and have no attn_k / attn_v / attn_k_norm.
  int64_t n_embd_pl = 0, n_shared_kv = 0;
  // The layer whose K/V layer l reads (l itself unless it shares).
  int64_t kv_source(int64_t l) const {
    const int64_t first = n_layer - n_shared_kv;
    if (n_shared_kv == 0 || l < first) return l;
    return sliding[size_t(l)] ? first - 2 : first - 1;
  }
};

struct G4Model {
  G4Config c;
  std::map<std::string, std::vector<float>> w;
  std::map<std::string, std::vector<int64_t>> ne;
};

inline std::string bn(int64_t l, const char* n) {
  return "blk." + std::to_string(l) + "." + n;
}

inline G4Model make_g4(const G4Config& c, uint64_t seed) {
  G4Model m;
  m.c = c;
  Rng rng(seed);
  auto r = [&] { return rng.uniform() * 2 - 1; };
  auto matrix = [&](const std::string& name, int64_t in, int64_t out, double scale) {
    std::vector<float> v(static_cast<size_t>(in * out));
    for (float& x : v) x = float(r() * scale / std::sqrt(double(in)));
    m.w[name] = v;
    m.ne[name] = {in, out};
  };
  auto vec = [&](const std::string& name, int64_t n, double center, double spread) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(center + r() * spread);
    m.w[name] = v;
    m.ne[name] = {n};
  };
  const int64_t E = c.n_embd;
  matrix("token_embd.weight", E, c.n_vocab, 3.0);  // tied head
  vec("output_norm.weight", E, 1.0, 0.3);
  {
    std::vector<float> f(static_cast<size_t>(c.hd_global / 2), 1e30f);
    for (int64_t i = 0; i < int64_t(double(c.hd_global) * c.prf_global / 2); ++i) f[size_t(i)] = 1.0f;
    m.w["rope_freqs.weight"] = f;
    m.ne["rope_freqs.weight"] = {c.hd_global / 2};
  }
  if (c.n_embd_pl > 0) {
    matrix("per_layer_token_embd.weight", c.n_embd_pl * c.n_layer, c.n_vocab, 3.0);
    matrix("per_layer_model_proj.weight", E, c.n_embd_pl * c.n_layer, 2.0);
    vec("per_layer_proj_norm.weight", c.n_embd_pl, 1.0, 0.3);
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const bool s = c.sliding[size_t(l)];
    const int64_t hd = s ? c.hd_swa : c.hd_global, kv = s ? c.n_kv_swa : c.n_kv_global;
    const bool own_kv = c.kv_source(l) == l;
    vec(bn(l, "attn_norm.weight"), E, 1.0, 0.3);
    matrix(bn(l, "attn_q.weight"), E, c.n_head * hd, 1.5);
    if (own_kv) matrix(bn(l, "attn_k.weight"), E, kv * hd, 1.5);
    if (own_kv && s) matrix(bn(l, "attn_v.weight"), E, kv * hd, 1.5);
    matrix(bn(l, "attn_output.weight"), c.n_head * hd, E, 1.5);
    vec(bn(l, "attn_q_norm.weight"), hd, 1.0, 0.5);
    if (own_kv) vec(bn(l, "attn_k_norm.weight"), hd, 1.0, 0.5);
    if (c.n_embd_pl > 0) {
      matrix(bn(l, "inp_gate.weight"), E, c.n_embd_pl, 2.0);
      matrix(bn(l, "proj.weight"), c.n_embd_pl, E, 2.0);
      vec(bn(l, "post_norm.weight"), E, 1.0, 0.3);
    }
    vec(bn(l, "post_attention_norm.weight"), E, 1.0, 0.3);
    vec(bn(l, "ffn_norm.weight"), E, 1.0, 0.3);
    const int64_t ff = c.n_ff[size_t(l)];
    matrix(bn(l, "ffn_gate.weight"), E, ff, 2.0);
    matrix(bn(l, "ffn_up.weight"), E, ff, 2.0);
    matrix(bn(l, "ffn_down.weight"), ff, E, 2.0);
    vec(bn(l, "post_ffw_norm.weight"), E, 1.0, 0.3);
    if (l % 2 == 1) vec(bn(l, "layer_output_scale.weight"), 1, 0.7, 0.2);
    if (c.n_expert > 0) {
      const int64_t ne = c.n_expert, fe = c.n_ff_exp;
      matrix(bn(l, "ffn_gate_inp.weight"), E, ne, 4.0);  // peaky router: no near-ties in the top-k
      vec(bn(l, "ffn_gate_inp.scale"), E, 1.0, 0.3);
      vec(bn(l, "pre_ffw_norm_2.weight"), E, 1.0, 0.3);
      vec(bn(l, "post_ffw_norm_1.weight"), E, 1.0, 0.3);
      vec(bn(l, "post_ffw_norm_2.weight"), E, 1.0, 0.3);
      // 3-D {in, out, n_expert}: expert e's matrix is rows [e * out, (e + 1) * out) of a 2-D one.
      auto experts = [&](const std::string& name, int64_t in, int64_t out) {
        matrix(name, in, out * ne, 2.0);
        m.ne[name] = {in, out, ne};
      };
      if (c.fused_gate_up) {
        experts(bn(l, "ffn_gate_up_exps.weight"), E, 2 * fe);
      } else {
        experts(bn(l, "ffn_gate_exps.weight"), E, fe);
        experts(bn(l, "ffn_up_exps.weight"), E, fe);
      }
      experts(bn(l, "ffn_down_exps.weight"), fe, E);
      if (c.down_scale) vec(bn(l, "ffn_down_exps.scale"), ne, 1.0, 0.5);
    }
  }
  return m;
}

inline void write_g4(const G4Model& m, const std::filesystem::path& path,
                     const std::vector<std::pair<std::string, Value>>& extra_keys = {},
                     const std::vector<std::pair<std::string, std::vector<int64_t>>>& extra_tensors = {},
                     const std::string& arch = "gemma4") {
  const G4Config& c = m.c;
  gguf::GgufWriter w;
  const std::string a = arch + ".";
  w.set("general.architecture", Value::string(arch));
  w.set(a + "context_length", Value::u32(4096));
  w.set(a + "embedding_length", Value::u32(uint32_t(c.n_embd)));
  w.set(a + "block_count", Value::u32(uint32_t(c.n_layer)));
  std::vector<int32_t> ff, kv;
  std::vector<Value> pattern;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    ff.push_back(int32_t(c.n_ff[size_t(l)]));
    kv.push_back(int32_t(c.sliding[size_t(l)] ? c.n_kv_swa : c.n_kv_global));
    pattern.push_back(Value::boolean(c.sliding[size_t(l)]));
  }
  w.set(a + "feed_forward_length", Value::i32_array(ff));
  w.set(a + "attention.head_count", Value::u32(uint32_t(c.n_head)));
  w.set(a + "attention.head_count_kv", Value::i32_array(kv));
  w.set(a + "attention.key_length", Value::u32(uint32_t(c.hd_global)));
  w.set(a + "attention.value_length", Value::u32(uint32_t(c.hd_global)));
  w.set(a + "attention.key_length_swa", Value::u32(uint32_t(c.hd_swa)));
  w.set(a + "attention.value_length_swa", Value::u32(uint32_t(c.hd_swa)));
  w.set(a + "rope.dimension_count", Value::u32(uint32_t(c.hd_global)));
  w.set(a + "rope.dimension_count_swa", Value::u32(uint32_t(c.n_rot_swa)));
  w.set(a + "rope.freq_base", Value::f32(c.base));
  w.set(a + "rope.freq_base_swa", Value::f32(c.base_swa));
  w.set(a + "attention.sliding_window", Value::u32(uint32_t(c.window)));
  w.set(a + "attention.sliding_window_pattern", Value::array(gguf::ValueType::BOOL, pattern));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(c.eps));
  w.set(a + "attention.shared_kv_layers", Value::u32(uint32_t(c.n_shared_kv)));
  w.set(a + "embedding_length_per_layer_input", Value::u32(uint32_t(c.n_embd_pl)));
  if (c.softcap > 0) w.set(a + "final_logit_softcapping", Value::f32(c.softcap));
  if (c.n_expert > 0) {
    w.set(a + "expert_count", Value::u32(uint32_t(c.n_expert)));
    w.set(a + "expert_used_count", Value::u32(uint32_t(c.n_expert_used)));
    w.set(a + "expert_feed_forward_length", Value::u32(uint32_t(c.n_ff_exp)));
  }
  for (const auto& [k, v] : extra_keys) w.set(k, v);
  for (const auto& [name, vals] : m.w) {
    std::vector<uint8_t> bytes(vals.size() * 4);
    std::memcpy(bytes.data(), vals.data(), bytes.size());
    w.add_tensor(name, DType::F32, m.ne.at(name), std::move(bytes));
  }
  for (const auto& [name, shape] : extra_tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    w.add_tensor(name, DType::F32, shape, std::vector<uint8_t>(size_t(n) * 4, 0));
  }
  w.write(path.string());
}

// ---- reference forward (double precision, one sequence, every position), from C.3/C.4/C.6 ----

using Vec = std::vector<double>;

inline Vec matvec(const std::vector<float>& W, int64_t in, int64_t out, const Vec& x) {
  Vec y(static_cast<size_t>(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < in; ++i) s += double(W[size_t(o * in + i)]) * x[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}

// RMS(x[off, off+n)) * w (w null: unweighted), in place.
inline void rms(Vec& x, size_t off, size_t n, const std::vector<float>* w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (size_t i = 0; i < n; ++i) x[off + i] *= inv * (w ? double((*w)[i]) : 1.0);
}

// NEOX rope of one head at [off, off+hd): pairs (i, i + n_rot/2), theta = pos * base^(-2i/n_rot) / factor.
inline void rope(Vec& x, size_t off, int64_t n_rot, double base, int pos, const std::vector<float>* factors) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    double theta = pos * std::pow(base, -2.0 * double(i) / double(n_rot));
    if (factors) theta /= double((*factors)[size_t(i)]);
    const double c = std::cos(theta), s = std::sin(theta);
    const double a = x[off + size_t(i)], b = x[off + size_t(i + half)];
    x[off + size_t(i)] = a * c - b * s;
    x[off + size_t(i + half)] = a * s + b * c;
  }
}

inline double gelu_tanh(double z) {
  return 0.5 * z * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (z + 0.044715 * z * z * z)));
}

// The expert branch of layer l on x1 (C.5 steps 1-7): RMS(sum_j w_j * scale_e * down_e(gelu(gate_e(h)) *
// up_e(h))) * post_ffw_norm_2, h = RMS(x1) * pre_ffw_norm_2, experts and weights from the router.
inline Vec reference_moe(const G4Model& m, int64_t l, const Vec& x1) {
  const G4Config& c = m.c;
  const int64_t E = c.n_embd, ne = c.n_expert, fe = c.n_ff_exp;
  auto W = [&](const char* n) -> const std::vector<float>& { return m.w.at(bn(l, n)); };
  Vec r = x1;
  rms(r, 0, size_t(E), nullptr, c.eps);
  for (int64_t i = 0; i < E; ++i)
    r[size_t(i)] *= double(W("ffn_gate_inp.scale")[size_t(i)]) / std::sqrt(double(E));
  const Vec logits = matvec(W("ffn_gate_inp.weight"), E, ne, r);
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double v : logits) z += std::exp(v - mx);
  std::vector<int64_t> order(static_cast<size_t>(ne));
  for (int64_t e = 0; e < ne; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  double sum = 0;
  for (int64_t j = 0; j < c.n_expert_used; ++j) sum += std::exp(logits[size_t(order[size_t(j)])] - mx) / z;
  Vec h = x1;
  rms(h, 0, size_t(E), &W("pre_ffw_norm_2.weight"), c.eps);
  Vec out(static_cast<size_t>(E), 0.0);
  for (int64_t j = 0; j < c.n_expert_used; ++j) {
    const int64_t e = order[size_t(j)];
    const double w = std::exp(logits[size_t(e)] - mx) / z / std::max(sum, 6.1035e-5) *
                     (c.down_scale ? double(W("ffn_down_exps.scale")[size_t(e)]) : 1.0);
    auto expert_rows = [&](const char* name, int64_t first, int64_t rows, int64_t per_expert, int64_t in) {
      const std::vector<float>& all = W(name);
      return std::vector<float>(all.begin() + (e * per_expert + first) * in,
                                all.begin() + (e * per_expert + first + rows) * in);
    };
    Vec gate, up;
    if (c.fused_gate_up) {
      gate = matvec(expert_rows("ffn_gate_up_exps.weight", 0, fe, 2 * fe, E), E, fe, h);
      up = matvec(expert_rows("ffn_gate_up_exps.weight", fe, fe, 2 * fe, E), E, fe, h);
    } else {
      gate = matvec(expert_rows("ffn_gate_exps.weight", 0, fe, fe, E), E, fe, h);
      up = matvec(expert_rows("ffn_up_exps.weight", 0, fe, fe, E), E, fe, h);
    }
    for (int64_t i = 0; i < fe; ++i) gate[size_t(i)] = gelu_tanh(gate[size_t(i)]) * up[size_t(i)];
    const Vec y = matvec(expert_rows("ffn_down_exps.weight", 0, E, E, fe), fe, E, gate);
    for (int64_t i = 0; i < E; ++i) out[size_t(i)] += w * y[size_t(i)];
  }
  rms(out, 0, size_t(E), &W("post_ffw_norm_2.weight"), c.eps);
  return out;
}

// The layers and head over input rows x (row t at position t): visible(l, sliding, q, k) says whether row q
// sees row k in layer l; scale(l, t) is the factor row t's residual stream gets after layer l. toks: the
// rows' token ids, needed by per-layer inputs (C.7) only.
template <class Visible, class Scale>
std::vector<Vec> reference_forward(const G4Model& m, std::vector<Vec> x, Visible visible, Scale scale,
                                   const std::vector<int32_t>* toks = nullptr) {
  const G4Config& c = m.c;
  const int64_t E = c.n_embd, T = int64_t(x.size());
  const double eps = c.eps;
  auto W = [&](const std::string& n) -> const std::vector<float>& { return m.w.at(n); };
  // C.7 per-layer inputs: inp[t][l] = (RMS(proj(x0) / sqrt(E)) * proj_norm + pl_embd[t] * sqrt(npl)) /
  // sqrt(2)
  const int64_t npl = c.n_embd_pl;
  std::vector<Vec> ple_in(static_cast<size_t>(T));
  if (npl > 0) {
    if (!toks) throw std::runtime_error("reference_forward: per-layer inputs need the token ids");
    for (int64_t t = 0; t < T; ++t) {
      Vec proj = matvec(W("per_layer_model_proj.weight"), E, npl * c.n_layer, x[size_t(t)]);
      for (double& v : proj) v /= std::sqrt(double(E));
      for (int64_t l = 0; l < c.n_layer; ++l)
        rms(proj, size_t(l * npl), size_t(npl), &W("per_layer_proj_norm.weight"), eps);
      const std::vector<float>& pe = W("per_layer_token_embd.weight");
      for (int64_t i = 0; i < npl * c.n_layer; ++i)
        proj[size_t(i)] = (proj[size_t(i)] + double(pe[size_t((*toks)[size_t(t)] * npl * c.n_layer + i)]) *
                                                 double(std::sqrt(float(npl)))) /
                          std::sqrt(2.0);
      ple_in[size_t(t)] = proj;
    }
  }
  std::map<int64_t, std::pair<std::vector<Vec>, std::vector<Vec>>> kv_of;  // each own-KV layer's K and V
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const bool s = c.sliding[size_t(l)];
    const int64_t hd = s ? c.hd_swa : c.hd_global, nkv = s ? c.n_kv_swa : c.n_kv_global;
    const int64_t n_rot = s ? c.n_rot_swa : c.hd_global;
    const bool own_kv = c.kv_source(l) == l;
    const double base = s ? c.base_swa : c.base;
    const std::vector<float>* factors = s ? nullptr : &W("rope_freqs.weight");
    std::vector<Vec> Q(static_cast<size_t>(T)), K(static_cast<size_t>(T)), V(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec h = x[size_t(t)];
      rms(h, 0, size_t(E), &W(bn(l, "attn_norm.weight")), eps);
      Q[size_t(t)] = matvec(W(bn(l, "attn_q.weight")), E, c.n_head * hd, h);
      for (int64_t hh = 0; hh < c.n_head; ++hh) {
        rms(Q[size_t(t)], size_t(hh * hd), size_t(hd), &W(bn(l, "attn_q_norm.weight")), eps);
        rope(Q[size_t(t)], size_t(hh * hd), n_rot, base, int(t), factors);
      }
      if (!own_kv) continue;  // C.7: K/V come from the source layer
      K[size_t(t)] = matvec(W(bn(l, "attn_k.weight")), E, nkv * hd, h);
      V[size_t(t)] = s ? matvec(W(bn(l, "attn_v.weight")), E, nkv * hd, h) : K[size_t(t)];
      for (int64_t hh = 0; hh < nkv; ++hh) {
        rms(K[size_t(t)], size_t(hh * hd), size_t(hd), &W(bn(l, "attn_k_norm.weight")), eps);
        rope(K[size_t(t)], size_t(hh * hd), n_rot, base, int(t), factors);
        rms(V[size_t(t)], size_t(hh * hd), size_t(hd), nullptr, eps);
      }
    }
    if (own_kv) {
      kv_of[l] = {K, V};
    } else {
      K = kv_of.at(c.kv_source(l)).first;
      V = kv_of.at(c.kv_source(l)).second;
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec att(static_cast<size_t>(c.n_head * hd), 0.0);
      for (int64_t hh = 0; hh < c.n_head; ++hh) {
        const int64_t g = hh / (c.n_head / nkv);
        std::vector<double> sc(static_cast<size_t>(T), 0.0);
        double mx = -1e300;
        for (int64_t k = 0; k < T; ++k) {
          if (!visible(l, s, t, k)) continue;
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += Q[size_t(t)][size_t(hh * hd + i)] * K[size_t(k)][size_t(g * hd + i)];  // scale 1
          sc[size_t(k)] = d;
          mx = std::max(mx, d);
        }
        double sum = 0;
        for (int64_t k = 0; k < T; ++k)
          if (visible(l, s, t, k)) sum += (sc[size_t(k)] = std::exp(sc[size_t(k)] - mx));
        for (int64_t k = 0; k < T; ++k)
          if (visible(l, s, t, k))
            for (int64_t i = 0; i < hd; ++i)
              att[size_t(hh * hd + i)] += sc[size_t(k)] / sum * V[size_t(k)][size_t(g * hd + i)];
      }
      Vec a = matvec(W(bn(l, "attn_output.weight")), c.n_head * hd, E, att);
      rms(a, 0, size_t(E), &W(bn(l, "post_attention_norm.weight")), eps);
      Vec& xt = x[size_t(t)];
      for (int64_t i = 0; i < E; ++i) xt[size_t(i)] += a[size_t(i)];
      Vec g = xt;
      rms(g, 0, size_t(E), &W(bn(l, "ffn_norm.weight")), eps);
      const int64_t ff = c.n_ff[size_t(l)];
      Vec gate = matvec(W(bn(l, "ffn_gate.weight")), E, ff, g),
          up = matvec(W(bn(l, "ffn_up.weight")), E, ff, g);
      for (int64_t i = 0; i < ff; ++i) {
        const double z = gate[size_t(i)];
        const double gelu =
            0.5 * z * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (z + 0.044715 * z * z * z)));
        gate[size_t(i)] = gelu * up[size_t(i)];
      }
      Vec f = matvec(W(bn(l, "ffn_down.weight")), ff, E, gate);
      if (c.n_expert > 0) {  // C.5: RMS(dense) * post_ffw_norm_1 + the expert branch
        rms(f, 0, size_t(E), &W(bn(l, "post_ffw_norm_1.weight")), eps);
        const Vec moe = reference_moe(m, l, xt);
        for (int64_t i = 0; i < E; ++i) f[size_t(i)] += moe[size_t(i)];
      }
      rms(f, 0, size_t(E), &W(bn(l, "post_ffw_norm.weight")), eps);
      for (int64_t i = 0; i < E; ++i) xt[size_t(i)] += f[size_t(i)];
      if (npl > 0) {  // C.7 step 4
        Vec g = matvec(W(bn(l, "inp_gate.weight")), E, npl, xt);
        for (int64_t i = 0; i < npl; ++i)
          g[size_t(i)] = gelu_tanh(g[size_t(i)]) * ple_in[size_t(t)][size_t(l * npl + i)];
        Vec p = matvec(W(bn(l, "proj.weight")), npl, E, g);
        rms(p, 0, size_t(E), &W(bn(l, "post_norm.weight")), eps);
        for (int64_t i = 0; i < E; ++i) xt[size_t(i)] += p[size_t(i)];
      }
      const double out_scale = scale(l, t);
      for (double& v : xt) v *= out_scale;
    }
  }
  std::vector<Vec> logits;
  for (int64_t t = 0; t < T; ++t) {
    Vec h = x[size_t(t)];
    rms(h, 0, size_t(E), &W("output_norm.weight"), eps);
    Vec lg = matvec(W("token_embd.weight"), E, c.n_vocab, h);
    if (c.softcap > 0)
      for (double& v : lg) v = c.softcap * std::tanh(v / c.softcap);
    logits.push_back(lg);
  }
  return logits;
}

// gemma4: token rows scaled by sqrt(n_embd), causal + SWA (q - k < window), layer_output_scale.
inline std::vector<Vec> reference_logits(const G4Model& m, const std::vector<int32_t>& toks) {
  const int64_t E = m.c.n_embd, T = int64_t(toks.size());
  std::vector<Vec> x(static_cast<size_t>(T), Vec(static_cast<size_t>(E)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < E; ++i)
      x[size_t(t)][size_t(i)] =
          double(m.w.at("token_embd.weight")[size_t(toks[size_t(t)] * E + i)]) * double(std::sqrt(float(E)));
  const int32_t window = m.c.window;
  auto visible = [window](int64_t, bool sliding, int64_t q, int64_t k) {
    return k <= q && (!sliding || q - k < window);
  };
  auto scale = [&m](int64_t l, int64_t) {
    auto it = m.w.find(bn(l, "layer_output_scale.weight"));
    return it == m.w.end() ? 1.0 : double(it->second[0]);
  };
  return reference_forward(m, std::move(x), visible, scale, &toks);
}

// ---- running tandem ----

struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("tandem_gemma4_" + std::to_string(getpid()) + "_" + name + ".gguf")) {}
  ~TempFile() { std::filesystem::remove(path); }
};

// devices: "" (the default device, the CPU), "cuda:0", or a list split by `mode` (layer / tensor).
inline std::shared_ptr<Model> load(const std::string& path, const std::string& mode = "",
                                   const std::string& devices = "") {
  ModelParams mp;
  mp.n_threads = 1;
  mp.devices = devices;
  if (!mode.empty()) mp.split_mode = mode;
  return Model::load(path, mp);
}

// Logits of every prompt row (the prompt in one step), then of 5 greedy steps one row each; tokens: the
// greedy tokens (6: the prompt's argmax, then each step's; the first 5 were fed).
struct G4Run {
  std::vector<std::vector<float>> prompt, steps;
  std::vector<int32_t> tokens;
};

inline G4Run run(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt) {
  SessionParams sp;
  sp.n_ctx = 64;
  sp.n_seq_max = 1;
  sp.kv_type = KvType::F32;
  sp.n_batch = 32;
  sp.block_size = 4;
  Session s(model, sp);
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(i), 0, true);
  s.decode(b);
  G4Run out;
  for (size_t i = 0; i < b.size(); ++i) out.prompt.emplace_back(s.logits(i).begin(), s.logits(i).end());
  int32_t t = argmax(s.logits(b.size() - 1));
  out.tokens.push_back(t);  // the fed tokens: this one, then each step's argmax
  int32_t pos = int32_t(prompt.size());
  for (int step = 0; step < 5; ++step) {
    Batch g;
    g.add(t, pos++, 0, true);
    s.decode(g);
    out.steps.emplace_back(s.logits(0).begin(), s.logits(0).end());
    t = argmax(s.logits(0));
    out.tokens.push_back(t);
  }
  return out;
}

inline std::vector<int32_t> prompt_of(int64_t n_vocab) {
  Rng rng(11);
  std::vector<int32_t> p;
  for (int i = 0; i < 11; ++i) p.push_back(int32_t(rng.next() % uint64_t(n_vocab)));
  return p;
}

// max |a - b| / max |b| over the rows.
inline double row_error(const std::vector<std::vector<float>>& a, const std::vector<Vec>& b) {
  double worst = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b[r].size(); ++i) {
      num = std::max(num, std::abs(double(a[r][i]) - b[r][i]));
      den = std::max(den, std::abs(b[r][i]));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

inline std::vector<Vec> as_double(const std::vector<std::vector<float>>& v) {
  std::vector<Vec> out;
  for (const auto& r : v) out.emplace_back(r.begin(), r.end());
  return out;
}

// The model at `path` split over cpu:0,cpu:1 by each of `modes` gives the single-device run of prompt p: its
// prompt and step logits within 1e-5 relative (f32 sums in another order) and the same greedy tokens.
inline void expect_cpu_splits_give_single_device_run(const std::string& path, const std::vector<int32_t>& p,
                                                     std::initializer_list<const char*> modes) {
  const G4Run single = run(load(path), p);
  for (const char* mode : modes) {
    SCOPED_TRACE(mode);
    const auto model = load(path, mode, "cpu:0,cpu:1");
    EXPECT_EQ(model->info().split_mode, mode);
    EXPECT_EQ(model->info().devices.size(), 2u);
    const G4Run split = run(model, p);
    EXPECT_LE(row_error(split.prompt, as_double(single.prompt)), 1e-5);
    EXPECT_LE(row_error(split.steps, as_double(single.steps)), 1e-5);
    EXPECT_EQ(split.tokens, single.tokens);
  }
}

}  // namespace tandem::g4test
