// Tiny random llama / qwen3 models for tests: weights, a GGUF writer with knobs for broken files, and a plain
// double-precision reference forward pass (written from GGUF-ARCH-FACTS B.3/B.4, independent of Ops).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/half.h"
#include "gguf/gguf.h"
#include "tandem/rng.h"

namespace tandem::testing {

struct TinyConfig {
  std::string arch = "qwen3";
  int64_t n_vocab = 96;
  int64_t n_embd = 64;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 16;
  int64_t n_ff = 96;
  bool tied = false;
  bool rope_freqs = false;  // llama: write rope_freqs.weight
  float freq_base = 10000.0f;
  float rope_scale_linear = 0.0f;  // > 0: rope.scaling.type linear with this factor
  float eps = 1e-6f;
  DType wtype = DType::F32;  // matrices: F32, F16 or BF16
  uint64_t seed = 1;
};

struct TinyModel {
  TinyConfig cfg;
  std::map<std::string, std::vector<float>> w;  // values as the GGUF stores them (after f16/bf16 rounding)
  std::map<std::string, std::vector<int64_t>> ne;
};

inline std::string blk_name(int64_t l, const char* n) {
  return "blk." + std::to_string(l) + "." + n;
}

inline TinyModel make_tiny(const TinyConfig& c) {
  TinyModel m;
  m.cfg = c;
  Rng rng(c.seed);
  auto round = [&](float v) {
    if (c.wtype == DType::F16) return fp16_to_fp32(fp32_to_fp16(v));
    if (c.wtype == DType::BF16) return bf16_to_fp32(fp32_to_bf16(v));
    return v;
  };
  auto matrix = [&](const std::string& name, int64_t in, int64_t out, float scale) {
    std::vector<float> v(static_cast<size_t>(in * out));
    for (float& x : v) x = round(float((rng.uniform() * 2 - 1) * scale / std::sqrt(double(in))));
    m.w[name] = v;
    m.ne[name] = {in, out};
  };
  auto vec = [&](const std::string& name, int64_t n, float center, float spread) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(center + (rng.uniform() * 2 - 1) * spread);
    m.w[name] = v;
    m.ne[name] = {n};
  };
  const int64_t E = c.n_embd, hd = c.head_dim;
  matrix("token_embd.weight", E, c.n_vocab, 1.7f * std::sqrt(float(E)));
  vec("output_norm.weight", E, 1.0f, 0.3f);
  if (!c.tied) matrix("output.weight", E, c.n_vocab, 3.0f);
  if (c.rope_freqs) vec("rope_freqs.weight", hd / 2, 2.0f, 1.0f);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    vec(blk_name(l, "attn_norm.weight"), E, 1.0f, 0.3f);
    matrix(blk_name(l, "attn_q.weight"), E, c.n_head * hd, 2.0f);
    matrix(blk_name(l, "attn_k.weight"), E, c.n_head_kv * hd, 2.0f);
    matrix(blk_name(l, "attn_v.weight"), E, c.n_head_kv * hd, 1.5f);
    matrix(blk_name(l, "attn_output.weight"), c.n_head * hd, E, 1.5f);
    if (c.arch == "qwen3") {
      vec(blk_name(l, "attn_q_norm.weight"), hd, 1.0f, 0.3f);
      vec(blk_name(l, "attn_k_norm.weight"), hd, 1.0f, 0.3f);
    }
    vec(blk_name(l, "ffn_norm.weight"), E, 1.0f, 0.3f);
    matrix(blk_name(l, "ffn_gate.weight"), E, c.n_ff, 1.5f);
    matrix(blk_name(l, "ffn_up.weight"), E, c.n_ff, 1.5f);
    matrix(blk_name(l, "ffn_down.weight"), c.n_ff, E, 1.5f);
  }
  return m;
}

// Knobs for writing broken files.
struct WriteOptions {
  std::set<std::string> skip_tensors;
  std::map<std::string, std::vector<int64_t>>
      reshape;  // write this tensor with other dims (and that many values)
  std::set<std::string> skip_keys;
  bool wide_ints = false;  // write integer keys as uint64 / int32 arrays instead of uint32
  std::map<std::string, gguf::Value> extra_keys;
  std::vector<std::pair<std::string, std::vector<int64_t>>> extra_tensors;  // f32 zeros
};

inline void write_tiny_gguf(const TinyModel& m, const std::filesystem::path& path,
                            const WriteOptions& o = {}) {
  using gguf::Value;
  const TinyConfig& c = m.cfg;
  gguf::GgufWriter w;
  auto set = [&](const std::string& k, Value v) {
    if (!o.skip_keys.count(k)) w.set(k, std::move(v));
  };
  auto u = [&](int64_t v) { return o.wide_ints ? Value::u64(uint64_t(v)) : Value::u32(uint32_t(v)); };
  const std::string a = c.arch + ".";
  set("general.architecture", Value::string(c.arch));
  set("general.name", Value::string("tiny-" + c.arch));
  set(a + "context_length", u(4096));
  set(a + "embedding_length", u(c.n_embd));
  set(a + "block_count", u(c.n_layer));
  if (o.wide_ints) {
    set(a + "feed_forward_length",
        Value::i32_array(std::vector<int32_t>(size_t(c.n_layer), int32_t(c.n_ff))));
    set(a + "attention.head_count",
        Value::i32_array(std::vector<int32_t>(size_t(c.n_layer), int32_t(c.n_head))));
  } else {
    set(a + "feed_forward_length", u(c.n_ff));
    set(a + "attention.head_count", u(c.n_head));
  }
  set(a + "attention.head_count_kv", o.wide_ints ? Value::i16(int16_t(c.n_head_kv)) : u(c.n_head_kv));
  set(a + "attention.key_length", u(c.head_dim));
  set(a + "attention.value_length", u(c.head_dim));
  set(a + "rope.freq_base", Value::f32(c.freq_base));
  set(a + "attention.layer_norm_rms_epsilon", Value::f32(c.eps));
  if (c.rope_scale_linear > 0) {
    set(a + "rope.scaling.type", Value::string("linear"));
    set(a + "rope.scaling.factor", Value::f32(c.rope_scale_linear));
  }
  if (c.arch == "llama") {
    set(a + "vocab_size", u(c.n_vocab));
    set(a + "rope.dimension_count", u(c.head_dim));
  }
  set("tokenizer.ggml.eos_token_id", u(c.n_vocab - 1));
  for (const auto& [k, v] : o.extra_keys) w.set(k, v);

  for (const auto& [name, values] : m.w) {
    if (o.skip_tensors.count(name)) continue;
    std::vector<int64_t> ne = m.ne.at(name);
    std::vector<float> vals = values;
    if (auto it = o.reshape.find(name); it != o.reshape.end()) {
      ne = it->second;
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      vals.resize(size_t(n), 0.5f);
    }
    const bool is_matrix = ne.size() == 2;
    const DType t = is_matrix ? c.wtype : DType::F32;
    std::vector<uint8_t> bytes;
    if (t == DType::F32) {
      bytes.resize(vals.size() * 4);
      std::memcpy(bytes.data(), vals.data(), bytes.size());
    } else {
      bytes.resize(vals.size() * 2);
      for (size_t i = 0; i < vals.size(); ++i) {
        const uint16_t h = t == DType::F16 ? fp32_to_fp16(vals[i]) : fp32_to_bf16(vals[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    w.add_tensor(name, t, ne, std::move(bytes));
  }
  for (const auto& [name, ne] : o.extra_tensors) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    w.add_tensor(name, DType::F32, ne, std::vector<uint8_t>(size_t(n) * 4, 0));
  }
  w.write(path.string());
}

// ---- reference forward (double precision, one sequence)
// --------------------------------------------------------

// Pieces of the double-precision references (reference_forward here, reference_dflash_block in
// test_dflash_fixture.h): written once from the descriptions (GGUF-ARCH-FACTS B.3/B.4, E.3), independent of
// Ops.

// y = W x with W stored {in, out}: row o is W[o * in .. o * in + in).
inline std::vector<double> ref_matvec(const std::vector<float>& w, const std::vector<double>& x,
                                      int64_t out) {
  const int64_t in = int64_t(x.size());
  std::vector<double> y(size_t(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < in; ++i) s += double(w[size_t(o * in + i)]) * x[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}

// RMS norm of x[off .. off + n) times g.
inline std::vector<double> ref_rms(const std::vector<double>& x, const std::vector<float>& g, int64_t off,
                                   int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[size_t(off + i)] * x[size_t(off + i)];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = x[size_t(off + i)] * inv * g[size_t(i)];
  return y;
}

// Per-head RMS norm (q_norm / k_norm) of n_heads heads of hd values, in place.
inline void ref_head_norm(std::vector<double>& v, int64_t n_heads, int64_t hd, const std::vector<float>& g,
                          double eps) {
  for (int64_t h = 0; h < n_heads; ++h) {
    const auto r = ref_rms(v, g, h * hd, hd, eps);
    std::copy(r.begin(), r.end(), v.begin() + h * hd);
  }
}

// Rotary embedding of n_heads heads of hd values at pos, in place: NEOX (halves) or normal (pairs); theta_i =
// pos * base^(-2i / hd) * freq_scale / freq_factors[i] (freq_factors: rope_freqs, or null).
inline void ref_rope(std::vector<double>& v, int64_t n_heads, int64_t hd, int64_t pos, double base, bool neox,
                     double freq_scale = 1.0, const std::vector<float>* freq_factors = nullptr) {
  for (int64_t h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * hd;
    for (int64_t i = 0; i < hd / 2; ++i) {
      double theta = double(pos) * std::pow(base, -2.0 * double(i) / double(hd)) * freq_scale;
      if (freq_factors) theta /= double((*freq_factors)[size_t(i)]);
      const double cs = std::cos(theta), sn = std::sin(theta);
      const int64_t a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * cs - x1 * sn;
      x[b] = x0 * sn + x1 * cs;
    }
  }
}

// Softmax attention of one query row q (H heads) over the first n_keys rows of K / V (HKV heads each; head
// h reads KV head h / (H / HKV)), scale 1 / sqrt(hd).
inline std::vector<double> ref_attend(const std::vector<double>& q, const std::vector<std::vector<double>>& K,
                                      const std::vector<std::vector<double>>& V, size_t n_keys, int64_t H,
                                      int64_t HKV, int64_t hd) {
  std::vector<double> att(size_t(H * hd), 0.0);
  for (int64_t hh = 0; hh < H; ++hh) {
    const int64_t kvh = hh / (H / HKV);
    std::vector<double> s(n_keys);
    double mx = -1e300;
    for (size_t j = 0; j < n_keys; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < hd; ++i) dot += q[size_t(hh * hd + i)] * K[j][size_t(kvh * hd + i)];
      s[j] = dot / std::sqrt(double(hd));
      mx = std::max(mx, s[j]);
    }
    double z = 0;
    for (double& v : s) z += (v = std::exp(v - mx));
    for (size_t j = 0; j < n_keys; ++j)
      for (int64_t i = 0; i < hd; ++i) att[size_t(hh * hd + i)] += s[j] / z * V[j][size_t(kvh * hd + i)];
  }
  return att;
}

// x += down(silu(gate(h)) * up(h)) with h = RMS(x) . norm: the pre-norm SwiGLU block.
inline void ref_swiglu_block(std::vector<double>& x, const std::vector<float>& norm,
                             const std::vector<float>& gate, const std::vector<float>& up,
                             const std::vector<float>& down, int64_t n_ff, double eps) {
  const int64_t E = int64_t(x.size());
  const auto h = ref_rms(x, norm, 0, E, eps);
  const auto g = ref_matvec(gate, h, n_ff);
  const auto u = ref_matvec(up, h, n_ff);
  std::vector<double> a(static_cast<size_t>(n_ff));
  for (int64_t i = 0; i < n_ff; ++i)
    a[size_t(i)] = g[size_t(i)] / (1 + std::exp(-g[size_t(i)])) * u[size_t(i)];
  const auto d = ref_matvec(down, a, E);
  for (int64_t i = 0; i < E; ++i) x[size_t(i)] += d[size_t(i)];
}

struct ReferenceResult {
  std::vector<std::vector<double>> logits;               // [position][vocab]
  std::vector<std::vector<std::vector<double>>> hidden;  // [layer 0..n_layer][position][n_embd]: layer inputs
};

inline ReferenceResult reference_forward(const TinyModel& m, const std::vector<int32_t>& tokens) {
  const TinyConfig& c = m.cfg;
  const int64_t E = c.n_embd, hd = c.head_dim, H = c.n_head, HKV = c.n_head_kv, T = int64_t(tokens.size());
  const double eps = double(c.eps);
  auto W = [&](const std::string& n) -> const std::vector<float>& { return m.w.at(n); };
  const bool neox = c.arch == "qwen3";
  const double freq_scale = c.rope_scale_linear > 0 ? 1.0 / c.rope_scale_linear : 1.0;
  const std::vector<float>* freq_factors = c.rope_freqs ? &W("rope_freqs.weight") : nullptr;

  ReferenceResult r;
  std::vector<std::vector<double>> x(static_cast<size_t>(T));
  const auto& emb = W("token_embd.weight");
  for (int64_t t = 0; t < T; ++t)
    x[size_t(t)].assign(emb.begin() + tokens[size_t(t)] * E, emb.begin() + (tokens[size_t(t)] + 1) * E);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    r.hidden.push_back(x);
    std::vector<std::vector<double>> K(static_cast<size_t>(T)), V(static_cast<size_t>(T)),
        Q(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const auto h = ref_rms(x[size_t(t)], W(blk_name(l, "attn_norm.weight")), 0, E, eps);
      Q[size_t(t)] = ref_matvec(W(blk_name(l, "attn_q.weight")), h, H * hd);
      K[size_t(t)] = ref_matvec(W(blk_name(l, "attn_k.weight")), h, HKV * hd);
      V[size_t(t)] = ref_matvec(W(blk_name(l, "attn_v.weight")), h, HKV * hd);
      if (c.arch == "qwen3") {
        ref_head_norm(Q[size_t(t)], H, hd, W(blk_name(l, "attn_q_norm.weight")), eps);
        ref_head_norm(K[size_t(t)], HKV, hd, W(blk_name(l, "attn_k_norm.weight")), eps);
      }
      ref_rope(Q[size_t(t)], H, hd, t, double(c.freq_base), neox, freq_scale, freq_factors);
      ref_rope(K[size_t(t)], HKV, hd, t, double(c.freq_base), neox, freq_scale, freq_factors);
    }
    for (int64_t t = 0; t < T; ++t) {  // causal: positions 0 .. t
      const auto att = ref_attend(Q[size_t(t)], K, V, size_t(t + 1), H, HKV, hd);
      const auto o = ref_matvec(W(blk_name(l, "attn_output.weight")), att, E);
      for (int64_t i = 0; i < E; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
      ref_swiglu_block(x[size_t(t)], W(blk_name(l, "ffn_norm.weight")), W(blk_name(l, "ffn_gate.weight")),
                       W(blk_name(l, "ffn_up.weight")), W(blk_name(l, "ffn_down.weight")), c.n_ff, eps);
    }
  }
  r.hidden.push_back(x);
  const auto& head = W(c.tied ? "token_embd.weight" : "output.weight");
  for (int64_t t = 0; t < T; ++t) {
    const auto h = ref_rms(x[size_t(t)], W("output_norm.weight"), 0, E, eps);
    r.logits.push_back(ref_matvec(head, h, c.n_vocab));
  }
  return r;
}

// max |a - b| / max |b| over one row: the relative error figure of the parity tests.
inline double row_rel_error(std::span<const float> a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0 ? num / den : num;
}

}  // namespace tandem::testing
