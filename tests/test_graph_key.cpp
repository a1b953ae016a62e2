// Which steps a session may replay as recorded CUDA graphs, and their keys (src/runtime/graph_key.h). The
// replays themselves run only on a GPU (tests/gpu: DflashGpu, SpecGpu, GpuBatchInvariance); what is checked
// here is the rule they rest on: two steps share a key only when every recorded kernel argument is the same.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "runtime/graph_key.h"

namespace tandem {
namespace {

Batch token_rows(AttentionMask mask, int n) {
  Batch b;
  b.mask.kind = mask;
  for (int i = 0; i < n; ++i) b.add(5 + i, i, 0, i + 1 == n);
  return b;
}

// n feature rows naming rows 0..n-1 of `source` (a DFlash drafter's K/V injection).
Batch feature_rows(const void* source, int64_t source_rows, int n) {
  Batch b;
  for (int i = 0; i < n; ++i) b.add(kNoToken, i, 0, false, true, i);
  b.embedding_source = EmbeddingSource{DeviceId{}, source, source_rows, 0};
  return b;
}

TEST(GraphKey, CausalTokenRowsAreShapeZeroWithOrWithoutAnUnusedSource) {
  StepShapeIds ids;
  const Batch plain = token_rows(AttentionMask::Causal, 3);
  const std::vector<int32_t> none(3, -1);
  const auto s = recordable_step_shape(plain, none, 0, 3, false);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(ids.id_of(*s), 0u);
  Batch with_source = plain;  // a source no row reads changes no argument
  float buf[4] = {1, 2, 3, 4};
  with_source.embedding_source = EmbeddingSource{DeviceId{}, buf, 1, 0};
  const auto s2 = recordable_step_shape(with_source, none, 0, 3, true);
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(ids.id_of(*s2), 0u);
}

TEST(GraphKey, DraftBlocksAndFeatureRowsGetShapesOfTheirOwn) {
  StepShapeIds ids;
  const Batch block = token_rows(AttentionMask::BlockBidirectional, 8);
  const std::vector<int32_t> none(8, -1);
  const auto sb = recordable_step_shape(block, none, 0, 8, false);
  ASSERT_TRUE(sb.has_value());
  const auto block_id = ids.id_of(*sb);
  ASSERT_TRUE(block_id.has_value());
  EXPECT_NE(*block_id, 0u);
  EXPECT_EQ(ids.id_of(*sb), block_id);  // the next cycle's block replays the same recording

  float features[64] = {};
  const Batch feats = feature_rows(features, 8, 4);
  const std::vector<int32_t> rows = {0, 1, 2, 3};
  const auto sf = recordable_step_shape(feats, rows, 0, 4, true);
  ASSERT_TRUE(sf.has_value());
  const auto feat_id = ids.id_of(*sf);
  ASSERT_TRUE(feat_id.has_value());
  EXPECT_NE(*feat_id, 0u);
  EXPECT_NE(*feat_id, *block_id);

  // Another buffer, row count or stride is another recorded argument: another shape.
  float other[64] = {};
  const auto s_other = recordable_step_shape(feature_rows(other, 8, 4), rows, 0, 4, true);
  const auto s_rows = recordable_step_shape(feature_rows(features, 16, 4), rows, 0, 4, true);
  Batch strided = feats;
  strided.embedding_source.row_stride = 64;
  const auto s_stride = recordable_step_shape(strided, rows, 0, 4, true);
  std::set<uint32_t> seen = {0u, *block_id, *feat_id};
  for (const auto& s : {s_other, s_rows, s_stride}) {
    ASSERT_TRUE(s.has_value());
    const auto id = ids.id_of(*s);
    ASSERT_TRUE(id.has_value());
    EXPECT_TRUE(seen.insert(*id).second) << "shape id " << *id << " given twice";
  }
  // Only the chunk's rows count: a chunk of token rows after feature rows is shape 0.
  std::vector<int32_t> mixed = {0, 1, -1, -1};
  const auto tail = recordable_step_shape(feats, mixed, 2, 4, true);
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(ids.id_of(*tail), 0u);
}

TEST(GraphKey, StepsWhoseArgumentsChangeEveryStepAreNotRecorded) {
  const std::vector<int32_t> none(4, -1), rows = {0, 1, 2, 3};
  EXPECT_FALSE(recordable_step_shape(token_rows(AttentionMask::PrefixRegion, 4), none, 0, 4, true));
  EXPECT_FALSE(recordable_step_shape(token_rows(AttentionMask::Explicit, 4), none, 0, 4, true));
  float features[64] = {};
  // A source the session's devices cannot read in place (copied per step), and rows from host memory.
  EXPECT_FALSE(recordable_step_shape(feature_rows(features, 8, 4), rows, 0, 4, false));
  EXPECT_FALSE(recordable_step_shape(feature_rows(nullptr, 0, 4), rows, 0, 4, true));
}

TEST(GraphKey, ShapeTableIsBoundedAndKeysSeparateEveryField) {
  StepShapeIds ids;
  std::vector<float> bufs(StepShapeIds::kMaxStepShapes + 1);
  for (uint32_t i = 0; i < StepShapeIds::kMaxStepShapes; ++i) {
    StepShape s{AttentionMask::Causal, true, &bufs[i], 1, 0};
    EXPECT_EQ(ids.id_of(s), i + 1);
  }
  const StepShape full{AttentionMask::Causal, true, &bufs.back(), 1, 0};
  EXPECT_FALSE(ids.id_of(full).has_value());  // the step runs directly
  EXPECT_EQ(ids.id_of(StepShape{}), 0u);      // plain steps still record

  std::set<uint64_t> keys;
  for (uint64_t session : {1u, 2u})
    for (uint32_t taps : {0u, 1u})
      for (uint32_t shape : {0u, 1u, 255u})
        for (int64_t rows : {1, 9, 64})
          for (int64_t out : {int64_t(0), int64_t(1), rows})
            keys.insert(step_graph_key(session, taps, shape, rows, out));
  EXPECT_EQ(keys.size(), size_t(2 * 2 * 3 * 3 * 3) - 2 * 2 * 3);  // rows 1: out 1 and out rows coincide
  EXPECT_THROW(step_graph_key(1, 0, 0, 128, 0), Error);
  EXPECT_THROW(step_graph_key(1, 0, 0, 4, 5), Error);
}

}  // namespace
}  // namespace tandem
