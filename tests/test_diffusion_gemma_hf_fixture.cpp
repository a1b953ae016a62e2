// diffusion-gemma against transformers' canvas logits in CI (test_diffusion_gemma_hf.h): skips, saying so,
// until tests/data/models/diffusion_gemma_tiny.{gguf,json} (written on the H200 by
// scripts/device/diffusion_gemma.sh) is committed; the device script points it at its fresh fixture.
#include "backend/backend.h"
#include "test_diffusion_gemma_hf.h"

namespace tandem {
namespace {

TEST(DiffusionGemmaHf, CanvasLogitsMatchTransformers) {
  const std::string prefix = dghf::fixture_prefix();
  if (prefix.empty()) GTEST_SKIP() << "no diffusion_gemma_tiny fixture yet (scripts/device/diffusion_gemma.sh)";
  const std::string where = dghf::placement("cpu");
  if (where != "cpu") GTEST_SKIP() << "placement " << where << " runs in tandem_gpu_tests";
  dghf::check_fixture(prefix, where);
}

}  // namespace
}  // namespace tandem
