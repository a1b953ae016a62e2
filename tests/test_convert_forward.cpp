// End to end: a tiny HF checkpoint is converted to GGUF and run by tandem's Session; its logits must match a
// forward pass written here with Hugging Face semantics on the *unconverted* weights ([out, in] matrices,
// rotate-half RoPE, llama3 scaling dividing the inverse frequencies). This checks that the converter's Q/K
// permutation, names, shapes and rope_freqs are what the engine's NORM / NEOX rope needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "convert/hf_to_gguf.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_convert_fixture.h"

namespace tandem::convert {
namespace {
using namespace fixture;

using Weights = std::map<std::string, SourceTensor>;

// y = W x for an HF matrix W [out, in] (+ bias b [out] when given).
std::vector<float> linear(const SourceTensor& w, const std::vector<float>& x,
                          const SourceTensor* b = nullptr) {
  const int64_t out = w.shape[0], in = w.shape[1];
  std::vector<float> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double acc = b ? b->values[size_t(o)] : 0.0;
    for (int64_t i = 0; i < in; ++i) acc += double(w.values[size_t(o * in + i)]) * x[size_t(i)];
    y[size_t(o)] = float(acc);
  }
  return y;
}

// HF RMSNorm over each group of `n` values of x, times weight.
void rms_norm(std::vector<float>& x, int64_t n, const std::vector<float>& weight, double eps) {
  for (size_t g = 0; g < x.size() / size_t(n); ++g) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[g * n + i]) * x[g * n + i];
    const double r = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) x[g * n + i] = float(x[g * n + i] * r * weight[size_t(i)]);
  }
}

// HF rotate-half RoPE on each head of d values: pairs (i, i + d/2), angle pos * inv_freq[i].
void rope_rotate_half(std::vector<float>& x, int64_t d, int pos, const std::vector<double>& inv_freq) {
  for (size_t h = 0; h < x.size() / size_t(d); ++h) {
    float* v = x.data() + h * d;
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = pos * inv_freq[size_t(i)], c = std::cos(a), s = std::sin(a);
      const double x0 = v[i], x1 = v[i + d / 2];
      v[i] = float(x0 * c - x1 * s);
      v[i + d / 2] = float(x1 * c + x0 * s);
    }
  }
}

// Inverse frequencies as HF computes them, with llama3 scaling applied to them (not through a factor tensor).
std::vector<double> inv_freqs(const Spec& s) {
  const int64_t d = s.head_dim;
  std::vector<double> f(size_t(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) f[size_t(i)] = std::pow(s.rope_theta, -2.0 * double(i) / double(d));
  if (!s.rope_scaling.is_null() && s.rope_scaling.value("rope_type", "") == "llama3") {
    const double factor = s.rope_scaling["factor"], lo = s.rope_scaling["low_freq_factor"],
                 hi = s.rope_scaling["high_freq_factor"];
    const double old_ctx = s.rope_scaling["original_max_position_embeddings"];
    for (auto& x : f) {
      const double wavelen = 2 * std::numbers::pi / x;
      if (wavelen > old_ctx / lo) {
        x /= factor;
      } else if (wavelen >= old_ctx / hi) {
        const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
        x = (1 - smooth) * x / factor + smooth * x;
      }
    }
  }
  return f;
}

// Logits of every position of `tokens` (one sequence), HF semantics.
std::vector<std::vector<float>> hf_forward(const Spec& s, const Weights& w,
                                           const std::vector<int32_t>& tokens) {
  const double eps = 1e-5;  // config_of writes rms_norm_eps 1e-5
  const int64_t E = s.n_embd, hd = s.head_dim, nh = s.n_head, nkv = s.n_head_kv;
  const auto freqs = inv_freqs(s);
  auto W = [&](const std::string& n) -> const SourceTensor& { return w.at(n); };
  auto B = [&](const std::string& n) -> const SourceTensor* { return w.count(n) ? &w.at(n) : nullptr; };

  std::vector<std::vector<float>> xs;
  for (int32_t t : tokens) {
    const auto& emb = W("model.embed_tokens.weight").values;
    xs.emplace_back(emb.begin() + t * E, emb.begin() + (t + 1) * E);
  }
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    std::vector<std::vector<float>> qs, ks, vs;
    for (size_t pos = 0; pos < xs.size(); ++pos) {
      auto h = xs[pos];
      rms_norm(h, E, W(p + "input_layernorm.weight").values, eps);
      auto q = linear(W(p + "self_attn.q_proj.weight"), h, B(p + "self_attn.q_proj.bias"));
      auto k = linear(W(p + "self_attn.k_proj.weight"), h, B(p + "self_attn.k_proj.bias"));
      auto v = linear(W(p + "self_attn.v_proj.weight"), h, B(p + "self_attn.v_proj.bias"));
      if (!s.llama()) {
        rms_norm(q, hd, W(p + "self_attn.q_norm.weight").values, eps);
        rms_norm(k, hd, W(p + "self_attn.k_norm.weight").values, eps);
      }
      rope_rotate_half(q, hd, int(pos), freqs);
      rope_rotate_half(k, hd, int(pos), freqs);
      qs.push_back(q);
      ks.push_back(k);
      vs.push_back(v);
    }
    for (size_t pos = 0; pos < xs.size(); ++pos) {
      std::vector<float> attn(size_t(nh * hd), 0.0f);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / (nh / nkv);  // HF repeat_kv
        std::vector<double> score(pos + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= pos; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += double(qs[pos][size_t(h * hd + i)]) * ks[j][size_t(g * hd + i)];
          score[j] = d / std::sqrt(double(hd));
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (auto& x : score) sum += (x = std::exp(x - mx));
        for (size_t j = 0; j <= pos; ++j)
          for (int64_t i = 0; i < hd; ++i)
            attn[size_t(h * hd + i)] += float(score[j] / sum * vs[j][size_t(g * hd + i)]);
      }
      const auto o = linear(W(p + "self_attn.o_proj.weight"), attn, B(p + "self_attn.o_proj.bias"));
      for (int64_t i = 0; i < E; ++i) xs[pos][size_t(i)] += o[size_t(i)];
      auto h = xs[pos];
      rms_norm(h, E, W(p + "post_attention_layernorm.weight").values, eps);
      auto gate = linear(W(p + "mlp.gate_proj.weight"), h), up = linear(W(p + "mlp.up_proj.weight"), h);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      const auto down = linear(W(p + "mlp.down_proj.weight"), gate);
      for (int64_t i = 0; i < E; ++i) xs[pos][size_t(i)] += down[size_t(i)];
    }
  }
  std::vector<std::vector<float>> logits;
  const SourceTensor& head = s.tied ? W("model.embed_tokens.weight") : W("lm_head.weight");
  for (auto& x : xs) {
    rms_norm(x, E, W("model.norm.weight").values, eps);
    logits.push_back(linear(head, x));
  }
  return logits;
}

// Converts the checkpoint to an f32 GGUF, runs tandem on it and compares every position's logits.
void expect_tandem_matches_hf(const Spec& s, const std::string& name) {
  TempDir tmp(name);
  const Weights w = write_checkpoint(tmp / "hf", s);
  ConvertOptions o;
  o.hf_dir = tmp / "hf";
  o.output = tmp / "model.gguf";
  o.type = OutType::F32;
  convert_hf_to_gguf(o);

  const std::vector<int32_t> tokens = {5, 258, 17, 100, 3, 259, 42, 200, 7, 11, 99, 64};
  const auto want = hf_forward(s, w, tokens);

  auto model = Model::load(o.output.string(), {.n_threads = 2});
  Session session(model, {.n_ctx = 64, .n_seq_max = 1, .n_batch = 16, .kv_type = KvType::F32});
  Batch batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], int32_t(i), 0, true);
  session.decode(batch);
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    const auto got = session.logits(pos);
    ASSERT_EQ(got.size(), want[pos].size());
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_ref = std::max(max_ref, double(std::fabs(want[pos][i])));
      max_diff = std::max(max_diff, double(std::fabs(got[i] - want[pos][i])));
    }
    // f32 weights and KV: only summation order differs.
    EXPECT_LT(max_diff, 1e-3 * max_ref) << "position " << pos;
  }
}

Spec small_spec() {
  Spec s;
  s.weight_std = 0.15f;  // keeps activations O(1) through the random layers
  s.dtype = StDType::F32;
  return s;
}

TEST(ConvertForward, Qwen3MatchesHfSemantics) {
  Spec s = small_spec();  // head_dim 32: n_head * head_dim = 128 != n_embd = 64
  expect_tandem_matches_hf(s, "fwd_qwen3");
}

TEST(ConvertForward, LlamaWithBiasesMatchesHfSemantics) {
  Spec s = small_spec();
  s.hf_arch = "LlamaForCausalLM";
  s.head_dim = 16;
  s.write_head_dim = false;
  s.attention_bias = true;
  s.rope_theta = 10000.0;
  expect_tandem_matches_hf(s, "fwd_llama");
}

TEST(ConvertForward, Llama3RopeScalingMatchesHfSemantics) {
  Spec s = small_spec();
  s.hf_arch = "LlamaForCausalLM";
  s.head_dim = 16;
  s.tied = true;
  // A small original context so that the 12 positions see scaled, smoothed and unscaled frequencies alike.
  s.rope_theta = 10000.0;
  s.rope_scaling = {{"rope_type", "llama3"},
                    {"factor", 8.0},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 64}};
  expect_tandem_matches_hf(s, "fwd_llama3");
}

}  // namespace
}  // namespace tandem::convert
