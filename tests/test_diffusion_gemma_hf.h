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

// Runs the fixture on `where` (cpu, cuda, layer, tensor); returns the worst relative error seen.
inline void check_fixture(const std::string& prefix, const std::string& where) {
  std::ifstream in(prefix + ".json");
  ASSERT_TRUE(in.good()) << prefix << ".json";
  const nlohmann::json fx = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = fx["prompt"].get<std::vector<int32_t>>();
  const double tol = fx.value("tolerance", 1e-3);
  ASSERT_FALSE(fx["steps"].empty());
  ModelParams mp;
  mp.n_threads = 2;
  if (where == "cuda") mp.devices = "cuda:0";
  if (where == "layer" || where == "tensor") {
    mp.devices = "cuda:0,cuda:0";
    mp.split_mode = where;
  }
  auto model = Model::load(prefix + ".gguf", mp);
  for (bool kv : {false, true})
    for (Toggle dev : {Toggle::Off, Toggle::On}) {
      SCOPED_TRACE(where + (kv ? " PREFILL+DECODE" : " UNIFIED") + (dev == Toggle::On ? " device SC" : " host SC"));
      CanvasOptions o;
      o.kv_cache = kv ? Toggle::On : Toggle::Off;
      o.gpu_sampling = dev;
      o.max_prompt = int32_t(prompt.size());
      auto src = make_canvas_source(model, o);
      src->begin_block(prompt);
      for (size_t k = 0; k < fx["steps"].size(); ++k) {
        const nlohmann::json st = fx["steps"][k];  // copies: no reference through operator[] (GCC 13)
        const Tensor& t = src->forward(st["canvas"].get<std::vector<int32_t>>(), st["use_sc"].get<bool>(),
                                       st["temp_inv"].get<float>());
        std::vector<float> got(size_t(t.ne[0] * t.ne[1]));
        if (t.device.kind == DeviceKind::CPU) {
          std::copy_n(static_cast<const float*>(t.data), got.size(), got.begin());
        } else {  // the SC buffer is on the first rank's device, written on its default stream
          Device& d = model->impl().main_device();
          ASSERT_EQ(d.id(), t.device);
          d.copy_to_host(d.default_stream(), got.data(), t.data, got.size() * 4);
          d.default_stream().synchronize();
        }
        const nlohmann::json want = st["logits"];
        ASSERT_EQ(int64_t(want.size()), t.ne[1]);
        double worst = 0;
        for (size_t r = 0; r < want.size(); ++r) {
          double num = 0, den = 0;
          for (size_t v = 0; v < want[r].size(); ++v) {
            const double w = want[r][v].get<double>();
            num = std::max(num, std::abs(double(got[r * size_t(t.ne[0]) + v]) - w));
            den = std::max(den, std::abs(w));
          }
          worst = std::max(worst, num / std::max(den, 1e-30));
        }
        std::printf("  %s %s %s step %zu: rel error %.3e\n", where.c_str(), kv ? "kv" : "unified",
                    dev == Toggle::On ? "devSC" : "hostSC", k, worst);
        EXPECT_LE(worst, tol) << "step " << k;
      }
    }
}

}  // namespace tandem::dghf
