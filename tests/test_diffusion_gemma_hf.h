// diffusion-gemma against transformers' own canvas logits: a fixture <prefix>.gguf + <prefix>.json written by
// tests/reference/diffusion_gemma_parity.py on the GPU machine (prompt, per step: canvas, use_sc, 1/t and
// transformers' C x n_vocab logits). Every step is run UNIFIED and PREFILL + DECODE, with host and device
// self-conditioning, on a placement; each step's logits must be within the fixture's tolerance (max relative
// error per row). Shared by tests/test_diffusion_gemma_hf_fixture.cpp (cpu) and
// tests/gpu/test_gpu_diffusion_gemma.cpp (cuda, layer, tensor).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_impl.h"
#include "tandem/diffusion.h"
#include "tandem/model.h"

namespace tandem::dghf {

namespace fs = std::filesystem;

// The fixture prefix: $TANDEM_DG_FIXTURE, else the committed CI one (empty when absent).
inline std::string fixture_prefix() {
  if (const char* e = std::getenv("TANDEM_DG_FIXTURE")) return e;
  const fs::path p = fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "models" / "diffusion_gemma_tiny";
  return fs::exists(p.string() + ".json") ? p.string() : "";
}

inline std::string placement(const std::string& fallback) {
  const char* e = std::getenv("TANDEM_DG_PLACEMENT");
  return e ? e : fallback;
}

// The fixture's logits, per step C rows of n_vocab flattened: inline in the json ("logits" of each step), or
// in the binary file the json names ("logits_f32": steps x C x n_vocab float32, for the large shapes).
inline std::vector<std::vector<float>> fixture_logits(const std::string& prefix, const nlohmann::json& fx,
                                                      int64_t n_vocab) {
  std::vector<std::vector<float>> out;
  const size_t C = fx["canvas_length"].get<size_t>();
  if (fx.contains("logits_f32")) {
    const fs::path bin = fs::path(prefix).parent_path() / fx["logits_f32"].get<std::string>();
    std::ifstream in(bin, std::ios::binary);
    EXPECT_TRUE(in.good()) << bin;
    for (size_t k = 0; k < fx["steps"].size(); ++k) {
      std::vector<float> step(C * size_t(n_vocab));
      in.read(reinterpret_cast<char*>(step.data()), std::streamsize(step.size() * 4));
      EXPECT_TRUE(in.good()) << bin << " is shorter than " << fx["steps"].size() << " steps";
      out.push_back(std::move(step));
    }
    return out;
  }
  const nlohmann::json steps = fx["steps"];  // copies: no reference through operator[] (GCC 13)
  for (const auto& st : steps) {
    std::vector<float> step;
    const nlohmann::json logits = st["logits"];
    for (const auto& row : logits)
      for (const auto& v : row) step.push_back(v.get<float>());
    EXPECT_EQ(step.size(), C * size_t(n_vocab));
    out.push_back(std::move(step));
  }
  return out;
}

// max over rows of max|got - want| / max|want| (both C rows of n_vocab).
inline double worst_row_error(const std::vector<float>& got, const std::vector<float>& want,
                              int64_t n_vocab) {
  double worst = 0;
  for (size_t r = 0; r * size_t(n_vocab) < want.size(); ++r) {
    double num = 0, den = 0;
    for (size_t v = 0; v < size_t(n_vocab); ++v) {
      const size_t i = r * size_t(n_vocab) + v;
      num = std::max(num, std::abs(double(got[i]) - double(want[i])));
      den = std::max(den, std::abs(double(want[i])));
    }
    worst = std::max(worst, num / std::max(den, 1e-30));
  }
  return worst;
}

// Runs the fixture on `where` (cpu, cuda, layer, tensor). Every step k > 0 self-conditions on the fixture's
// step k-1 logits (set_sc_logits: what transformers was given), so each step is compared alone and must be
// within the tolerance. A second run feeds tandem's own logits back (the chain the sampler runs); its errors
// are printed, not bounded: with random weights a step's relative error is multiplied by about
// max|logit| * 1/t through the next step's softmax (docs/ARCHITECTURE.md, "DiffusionGemma parity").
// Env: TANDEM_DG_MODES=device runs device SC only and no chain (the 26B shape, where host SC takes minutes);
// TANDEM_DG_THREADS (default 2).
inline void check_fixture(const std::string& prefix, const std::string& where) {
  std::ifstream in(prefix + ".json");
  ASSERT_TRUE(in.good()) << prefix << ".json";
  const nlohmann::json fx = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = fx["prompt"].get<std::vector<int32_t>>();
  const double tol = fx.value("tolerance", 1e-3);
  ASSERT_FALSE(fx["steps"].empty());
  const char* modes = std::getenv("TANDEM_DG_MODES");
  const bool device_only = modes && std::string(modes) == "device";
  ModelParams mp;
  mp.n_threads = std::getenv("TANDEM_DG_THREADS") ? std::atoi(std::getenv("TANDEM_DG_THREADS")) : 2;
  if (where == "cuda") mp.devices = "cuda:0";
  if (where == "layer" || where == "tensor") {
    mp.devices = "cuda:0,cuda:0";
    mp.split_mode = where;
  }
  auto model = Model::load(prefix + ".gguf", mp);
  const int64_t V = model->info().n_vocab;
  const std::vector<std::vector<float>> want = fixture_logits(prefix, fx, V);
  ASSERT_EQ(want.size(), fx["steps"].size());
  for (bool chained : {false, true})
    for (bool kv : {false, true})
      for (Toggle dev : {Toggle::Off, Toggle::On}) {
        if (device_only && (chained || dev == Toggle::Off)) continue;
        SCOPED_TRACE(where + (kv ? " PREFILL+DECODE" : " UNIFIED") +
                     (dev == Toggle::On ? " device SC" : " host SC"));
        CanvasOptions o;
        o.kv_cache = kv ? Toggle::On : Toggle::Off;
        o.gpu_sampling = dev;
        o.max_prompt = int32_t(prompt.size());
        auto src = make_canvas_source(model, o);
        src->begin_block(prompt);
        for (size_t k = 0; k < fx["steps"].size(); ++k) {
          const nlohmann::json st = fx["steps"][k];  // copies: no reference through operator[] (GCC 13)
          const bool use_sc = st["use_sc"].get<bool>();
          if (use_sc && !chained) {
            ASSERT_GT(k, 0u);
            src->set_sc_logits(want[k - 1]);
          }
          const Tensor& t =
              src->forward(st["canvas"].get<std::vector<int32_t>>(), use_sc, st["temp_inv"].get<float>());
          ASSERT_EQ(t.ne[0], V);
          std::vector<float> got(size_t(t.ne[0] * t.ne[1]));
          ASSERT_EQ(got.size(), want[k].size());
          if (t.device.kind == DeviceKind::CPU) {
            std::copy_n(static_cast<const float*>(t.data), got.size(), got.begin());
          } else {  // the SC buffer is on the first rank's device, written on its default stream
            Device& d = model->impl().main_device();
            ASSERT_EQ(d.id(), t.device);
            d.copy_to_host(d.default_stream(), got.data(), t.data, got.size() * 4);
            d.default_stream().synchronize();
          }
          const double worst = worst_row_error(got, want[k], V);
          std::printf("  %s %s %s step %zu%s: rel error %.3e\n", where.c_str(), kv ? "kv" : "unified",
                      dev == Toggle::On ? "devSC" : "hostSC", k, chained ? " (chained, not bounded)" : "",
                      worst);
          if (!chained) {
            EXPECT_LE(worst, tol) << "step " << k;
          }
        }
      }
}

}  // namespace tandem::dghf
