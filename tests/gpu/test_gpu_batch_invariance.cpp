// Batch invariance of a whole model on cuda:0: tests/test_batch_invariance_util.h says what and why.
#include <gtest/gtest.h>

#include "../test_batch_invariance_util.h"
#include "gpu_test_util.h"

namespace tandem {
namespace {

TEST(GpuBatchInvariance, RowLogitsDoNotDependOnTheRowsDecodedWithThem) {
  TANDEM_REQUIRE_GPU();
  testing::expect_batch_invariant_rows("cuda:0");
}

}  // namespace
}  // namespace tandem
