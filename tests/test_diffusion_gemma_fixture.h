// A tiny random diffusion-gemma model for tests (GGUF-ARCH-FACTS D): the gemma4 test model (sliding and global
// layers, partial rope, a global layer without attn_v) plus per-layer encoder and decoder scalars and the
// self-conditioning MLP; a writer with the diffusion.* keys; and a double-precision reference of the
// region-aware forward (D.3) and of self-conditioning (D.5), written here from the facts, independent of Ops
// and of the canvas runner. Used by tests/test_diffusion_gemma.cpp and tests/gpu/test_gpu_diffusion_gemma.cpp.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "tandem/diffusion.h"
#include "test_gemma4_fixture.h"

namespace tandem::dgtest {

using namespace g4test;

struct DgModel {
  G4Model g;
  int64_t sc_ff = 40;
  int32_t canvas = 6;
  int32_t mask_token = 95;
};

inline DgModel make_dg(const G4Config& c, uint64_t seed) {
  DgModel m;
  m.g = make_g4(c, seed);
  Rng rng(seed * 31 + 5);
  auto r = [&] { return rng.uniform() * 2 - 1; };
  auto put = [&](const std::string& name, std::vector<int64_t> ne, double center, double spread) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(center + r() * spread);
    m.g.w[name] = v;
    m.g.ne[name] = ne;
  };
  const int64_t E = c.n_embd;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    put(bn(l, "layer_output_scale.weight"), {1}, 0.8, 0.15);
    put(bn(l, "enc_layer_output_scale.weight"), {1}, 1.1, 0.15);
  }
  put("self_cond_pre_norm.weight", {E}, 1.0, 0.3);
  put("self_cond_gate.weight", {E, m.sc_ff}, 0.0, 2.0 / std::sqrt(double(E)));
  put("self_cond_up.weight", {E, m.sc_ff}, 0.0, 2.0 / std::sqrt(double(E)));
  put("self_cond_down.weight", {m.sc_ff, E}, 0.0, 4.0 / std::sqrt(double(m.sc_ff)));
  return m;
}

// keys: extra or replacing keys (e.g. canvas_length 0); drop: tensors to leave out.
inline void write_dg(const DgModel& m, const std::filesystem::path& path,
                     std::vector<std::pair<std::string, gguf::Value>> keys = {},
                     const std::vector<std::string>& drop = {}, bool with_mask_token = true) {
  using gguf::Value;
  std::vector<std::pair<std::string, Value>> all = {
      {"diffusion.canvas_length", Value::u32(uint32_t(m.canvas))},
      {"diffusion-gemma.attention.causal", Value::boolean(false)},
      {"diffusion.eb_max_steps", Value::u32(12)},
      {"diffusion.eb_entropy_bound", Value::f32(0.25f)},
  };
  if (with_mask_token) all.emplace_back("tokenizer.ggml.mask_token_id", Value::u32(uint32_t(m.mask_token)));
  for (auto& kv : keys) {
    bool replaced = false;
    for (auto& a : all)
      if (a.first == kv.first) a.second = kv.second, replaced = true;
    if (!replaced) all.push_back(kv);
  }
  G4Model g = m.g;
  for (const std::string& d : drop) {
    g.w.erase(d);
    g.ne.erase(d);
  }
  write_g4(g, path, all, {}, "diffusion-gemma");
}

// ---- reference (double precision), D.3 and D.5 ----

// Logits of the C canvas rows of one UNIFIED pass over [prompt | canvas]; sc: C added rows (or empty).
inline std::vector<Vec> ref_canvas_logits(const DgModel& m, const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& canvas, const std::vector<Vec>& sc) {
  const G4Config& c = m.g.c;
  const int64_t E = c.n_embd, P = int64_t(prompt.size()), C = int64_t(canvas.size()), T = P + C;
  const std::vector<float>& emb = m.g.w.at("token_embd.weight");
  std::vector<Vec> x(static_cast<size_t>(T), Vec(static_cast<size_t>(E)));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = t < P ? prompt[size_t(t)] : canvas[size_t(t - P)];
    for (int64_t i = 0; i < E; ++i)
      x[size_t(t)][size_t(i)] = double(emb[size_t(tok * E + i)]) * double(std::sqrt(float(E)));
    if (t >= P) {  // canvas: RMS_noscale(e + sc)
      if (!sc.empty())
        for (int64_t i = 0; i < E; ++i) x[size_t(t)][size_t(i)] += sc[size_t(t - P)][size_t(i)];
      rms(x[size_t(t)], 0, size_t(E), nullptr, c.eps);
    }
  }
  const int32_t w = c.window;
  auto visible = [&](int64_t, bool sliding, int64_t q, int64_t k) {
    if (q < P) return k <= q && (!sliding || q - k < w);  // prompt: causal + window, never the canvas
    if (k >= P) return true;                               // canvas sees the whole canvas
    return !sliding || k >= P - w + 1;                     // and the prompt (its last w - 1 on sliding layers)
  };
  auto scale = [&](int64_t l, int64_t t) {
    return double(m.g.w.at(bn(l, t < P ? "enc_layer_output_scale.weight" : "layer_output_scale.weight"))[0]);
  };
  std::vector<Vec> all = reference_forward(m.g, std::move(x), visible, scale);
  return std::vector<Vec>(all.begin() + P, all.end());
}

// The SC rows (D.5) of the previous logits (C rows of n_vocab) at 1/t = temp_inv.
inline std::vector<Vec> ref_self_cond(const DgModel& m, const std::vector<std::vector<float>>& prev,
                                      double temp_inv) {
  const G4Config& c = m.g.c;
  const int64_t E = c.n_embd, V = c.n_vocab, F = m.sc_ff;
  const std::vector<float>& emb = m.g.w.at("token_embd.weight");
  std::vector<Vec> out;
  for (const std::vector<float>& l : prev) {
    double mx = -1e300, z = 0;
    for (float v : l) mx = std::max(mx, double(v * float(temp_inv)));
    Vec p(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) z += (p[size_t(v)] = std::exp(double(l[size_t(v)] * float(temp_inv)) - mx));
    Vec soft(static_cast<size_t>(E), 0.0);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t i = 0; i < E; ++i)  // the F32 file's embedding as it is (transformers: the model's dtype)
        soft[size_t(i)] += p[size_t(v)] / z * double(emb[size_t(v * E + i)]);
    for (double& s : soft) s *= double(std::sqrt(float(E)));
    rms(soft, 0, size_t(E), &m.g.w.at("self_cond_pre_norm.weight"), c.eps);
    Vec g = matvec(m.g.w.at("self_cond_gate.weight"), E, F, soft);
    const Vec u = matvec(m.g.w.at("self_cond_up.weight"), E, F, soft);
    for (int64_t f = 0; f < F; ++f) {
      const double zz = g[size_t(f)];
      g[size_t(f)] = 0.5 * zz * (1 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (zz + 0.044715 * zz * zz * zz))) *
                     u[size_t(f)];
    }
    out.push_back(matvec(m.g.w.at("self_cond_down.weight"), F, E, g));
  }
  return out;
}

// The canvas logits a CanvasSource returned, as C host rows.
inline std::vector<std::vector<float>> host_rows(const Tensor& t) {
  std::vector<std::vector<float>> rows;
  const float* p = static_cast<const float*>(t.data);
  for (int64_t r = 0; r < t.ne[1]; ++r)
    rows.emplace_back(p + r * (t.nb[1] / 4), p + r * (t.nb[1] / 4) + t.ne[0]);
  return rows;
}

inline std::vector<int32_t> canvas_of(const DgModel& m, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> c;
  for (int32_t i = 0; i < m.canvas; ++i)
    c.push_back(rng.uniform() < 0.4 ? m.mask_token : int32_t(rng.next() % uint64_t(m.g.c.n_vocab)));
  return c;
}

}  // namespace tandem::dgtest
