// Batch invariance of a whole model on the CPU: tests/test_batch_invariance_util.h says what and why (the CPU
// speculative tests rest on it as the GPU ones do).
#include <gtest/gtest.h>

#include "test_batch_invariance_util.h"

namespace tandem {
namespace {

TEST(BatchInvariance, RowLogitsDoNotDependOnTheRowsDecodedWithThem) {
  testing::expect_batch_invariant_rows("cpu");
}

}  // namespace
}  // namespace tandem
