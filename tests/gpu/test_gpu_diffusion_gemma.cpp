// diffusion-gemma on CUDA: the tiny random model of tests/test_diffusion_gemma_fixture.h run through the
// CanvasSource on cuda:0 (PREFILL + DECODE and UNIFIED, device and host self-conditioning) gives the CPU's
// canvas logits and the double reference's; layer and tensor splits over cuda:0,cuda:0 (two ranks sharing the
// GPU) give the single-GPU logits, with the SC buffers on the first rank's device (where the embedding reads
// them). With TANDEM_DG_FIXTURE set (scripts/device/diffusion_gemma.sh), the transformers fixture on the
// placement TANDEM_DG_PLACEMENT (cuda, layer, tensor).
#include <gtest/gtest.h>

#include "../test_diffusion_gemma_fixture.h"
#include "../test_diffusion_gemma_hf.h"
#include "gpu_test_util.h"
#include "model/model_impl.h"

namespace tandem::gpu_test {
namespace {

using namespace dgtest;

G4Config config() {
  G4Config c;
  c.softcap = 12.0f;
  c.n_kv_global = 2;
  c.window = 4;
  return c;
}

using Steps = std::vector<std::vector<std::vector<float>>>;  // [step][canvas row][vocab]

// Three steps (step 0 without SC, then SC at 1/t = 1.25, 2); logits copied to the host. With `feed`, step k
// self-conditions on feed's step k-1 logits (set_sc_logits) instead of its own: two runs given the same feed
// get the same inputs at every step, so their steps compare alone. Fed back its own logits, a run's error of
// step k is multiplied by about max|logit| * 1/t at step k+1 (softcap 12 * 2 here): chained runs of two
// backends drift apart by ~1e-3 at step 2 from ~1e-6 at step 0 without any op being wrong.
Steps steps(const std::shared_ptr<Model>& model, bool kv, Toggle dev, const std::vector<int32_t>& prompt,
            const DgModel& m, std::string* describe = nullptr, DeviceId* where = nullptr,
            const Steps* feed = nullptr) {
  CanvasOptions o;
  o.kv_cache = kv ? Toggle::On : Toggle::Off;
  o.gpu_sampling = dev;
  o.max_prompt = 24;
  auto src = make_canvas_source(model, o);
  if (describe) *describe = src->describe();
  src->begin_block(prompt);
  Steps out;
  const float ti[] = {1.0f, 1.25f, 2.0f};
  for (int k = 0; k < 3; ++k) {
    if (feed && k > 0) {
      std::vector<float> flat;
      for (const auto& row : (*feed)[size_t(k - 1)]) flat.insert(flat.end(), row.begin(), row.end());
      src->set_sc_logits(flat);
    }
    const Tensor& t = src->forward(canvas_of(m, uint64_t(k + 1)), k > 0, ti[k]);
    if (where) *where = t.device;
    std::vector<float> h(size_t(t.ne[0] * t.ne[1]));
    if (t.device.kind == DeviceKind::CPU) {
      std::copy_n(static_cast<const float*>(t.data), h.size(), h.begin());
    } else {
      Device& d = model->impl().main_device();
      d.copy_to_host(d.default_stream(), h.data(), t.data, h.size() * 4);
      d.default_stream().synchronize();
    }
    std::vector<std::vector<float>> rows;
    for (int64_t r = 0; r < t.ne[1]; ++r)
      rows.emplace_back(h.begin() + r * t.ne[0], h.begin() + (r + 1) * t.ne[0]);
    out.push_back(rows);
  }
  return out;
}

TEST(GpuDiffusionGemma, CudaMatchesTheCpuAndTheReference) {
  TANDEM_REQUIRE_GPU();
  const DgModel m = make_dg(config(), 5);
  TempFile f("gpu_dg");
  write_dg(m, f.path);
  const std::vector<int32_t> prompt = prompt_of(m.g.c.n_vocab);
  const auto cpu = steps(load(f.path.string()), true, Toggle::Off, prompt, m);
  EXPECT_LE(row_error(cpu[0], ref_canvas_logits(m, prompt, canvas_of(m, 1), {})), 1e-4);
  const auto gpu_model = load(f.path.string(), "", "cuda:0");
  for (bool kv : {false, true})
    for (Toggle dev : {Toggle::Off, Toggle::On, Toggle::Auto}) {
      SCOPED_TRACE(std::string(kv ? "kv" : "unified") + " sc toggle " + std::to_string(int(dev)));
      std::string d;
      DeviceId where;
      const auto gpu = steps(gpu_model, kv, dev, prompt, m, &d, &where, &cpu);
      // Auto and On keep SC and the logits on the GPU; Off is the host path.
      EXPECT_EQ(where.kind, dev == Toggle::Off ? DeviceKind::CPU : DeviceKind::CUDA) << d;
      for (int k = 0; k < 3; ++k) {
        const double e = row_error(gpu[size_t(k)], as_double(cpu[size_t(k)]));
        std::printf("  %s sc toggle %d step %d: cuda vs cpu %.3e\n", kv ? "kv" : "unified", int(dev), k, e);
        EXPECT_LE(e, 1e-4) << k;
      }
      // The chain the sampler runs (own logits fed back): printed; step 0 has no SC and must agree.
      const auto chained = steps(gpu_model, kv, dev, prompt, m);
      EXPECT_LE(row_error(chained[0], as_double(cpu[0])), 1e-4);
      for (int k = 0; k < 3; ++k)
        std::printf("  chained cuda vs cpu step %d: %.3e\n", k,
                    row_error(chained[size_t(k)], as_double(cpu[size_t(k)])));
    }
}

TEST(GpuDiffusionGemma, LayerAndTensorSplitsOnOneGpuKeepScOnTheFirstRank) {
  TANDEM_REQUIRE_GPU();
  const DgModel m = make_dg(config(), 7);
  TempFile f("gpu_dg_split");
  write_dg(m, f.path);
  const std::vector<int32_t> prompt = prompt_of(m.g.c.n_vocab);
  // The single-GPU run of the same phase is the reference (UNIFIED and PREFILL+DECODE differ by their own
  // rounding); each split step gets that run's previous logits, so only the split differs.
  const auto single_model = load(f.path.string(), "", "cuda:0");
  const Steps single[2] = {steps(single_model, false, Toggle::On, prompt, m),
                           steps(single_model, true, Toggle::On, prompt, m)};
  for (const char* mode : {"layer", "tensor"}) {
    const auto model = load(f.path.string(), mode, "cuda:0,cuda:0");
    ASSERT_EQ(model->info().split_mode, mode);
    for (bool kv : {false, true}) {
      SCOPED_TRACE(std::string(mode) + (kv ? " kv" : " unified"));
      std::string d;
      DeviceId where;
      const Steps& ref = single[kv ? 1 : 0];
      const auto split = steps(model, kv, Toggle::On, prompt, m, &d, &where, &ref);
      EXPECT_NE(d.find("self-conditioning on cuda:0"), std::string::npos) << d;
      EXPECT_EQ(where, model->impl().ranks.front().device->id());
      for (int k = 0; k < 3; ++k) {
        const double e = row_error(split[size_t(k)], as_double(ref[size_t(k)]));
        std::printf("  %s %s step %d: split vs single %.3e\n", mode, kv ? "kv" : "unified", k, e);
        EXPECT_LE(e, 1e-4) << k;
      }
    }
  }
}

TEST(GpuDiffusionGemmaHf, CanvasLogitsMatchTransformers) {
  TANDEM_REQUIRE_GPU();
  const std::string prefix = dghf::fixture_prefix();
  if (prefix.empty()) GTEST_SKIP() << "no diffusion_gemma_tiny fixture (set TANDEM_DG_FIXTURE)";
  const std::string where = dghf::placement("cuda");
  if (where == "cpu") GTEST_SKIP() << "placement cpu runs in tandem_tests";
  dghf::check_fixture(prefix, where);
}

}  // namespace
}  // namespace tandem::gpu_test
