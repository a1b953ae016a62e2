// Paged KV cache bookkeeping: slots, block tables, reference counts, copy on write, rollback, exhaustion.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_storage.h"

namespace tandem {
namespace {

std::vector<int32_t> append(KvCacheTable& t, int32_t seq, int32_t n) {
  std::vector<int32_t> slots;
  t.append(seq, n, slots);
  return slots;
}

std::vector<int32_t> table(const KvCacheTable& t, int32_t seq) {
  auto b = t.block_table(seq);
  return {b.begin(), b.end()};
}

// Every block's reference count equals the number of sequences (and pending copies) that hold it, and the
// free list holds exactly the unreferenced blocks.
void expect_consistent(const KvCacheTable& t) {
  std::vector<int32_t> holders(size_t(t.n_blocks()), 0);
  for (int32_t s = 0; s < t.max_seqs(); ++s) {
    for (int32_t b : t.block_table(s)) ++holders[size_t(b)];
    EXPECT_EQ(int64_t(t.block_table(s).size()),
              (int64_t(t.seq_len(s)) + t.block_size() - 1) / t.block_size());
  }
  for (const BlockCopy& c : t.pending_copies()) ++holders[size_t(c.src_block)];
  int32_t free_blocks = 0;
  for (int32_t b = 0; b < t.n_blocks(); ++b) {
    EXPECT_EQ(t.ref_count(b), holders[size_t(b)]) << "block " << b;
    free_blocks += holders[size_t(b)] == 0;
  }
  EXPECT_EQ(t.n_free_blocks(), free_blocks);
}

TEST(KvCacheTable, AppendMapsPositionsToSlotsOfFreshBlocks) {
  KvCacheTable t(8, 4, 2);
  EXPECT_EQ(append(t, 0, 6), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));  // blocks 0, 1
  EXPECT_EQ(append(t, 1, 3), (std::vector<int32_t>{8, 9, 10}));          // block 2
  EXPECT_EQ(append(t, 0, 3), (std::vector<int32_t>{6, 7, 12}));          // rest of block 1, then block 3
  EXPECT_EQ(t.seq_len(0), 9);
  EXPECT_EQ(table(t, 0), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(t.slot(0, 8), 12);
  EXPECT_EQ(t.slot(1, 2), 10);
  EXPECT_EQ(t.n_free_blocks(), 4);
  EXPECT_TRUE(append(t, 1, 0).empty());
  EXPECT_TRUE(t.pending_copies().empty());
  expect_consistent(t);
  EXPECT_THROW(t.slot(0, 9), Error);
}

TEST(KvCacheTable, RemoveTailFreesWholeBlocksAndKeepsThePartialOne) {
  KvCacheTable t(8, 4, 1);
  append(t, 0, 10);  // blocks 0, 1, 2
  t.remove(0, 5);    // keeps positions 0..4: blocks 0, 1
  EXPECT_EQ(t.seq_len(0), 5);
  EXPECT_EQ(table(t, 0), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(t.n_free_blocks(), 6);
  // appending again reuses the partial block, then takes a free one
  EXPECT_EQ(append(t, 0, 4), (std::vector<int32_t>{5, 6, 7, 8}));
  t.remove(0, 8, 9);  // [8, 9) is the tail
  EXPECT_EQ(t.seq_len(0), 8);
  t.remove(0, 20);  // beyond the end: nothing
  EXPECT_EQ(t.seq_len(0), 8);
  t.remove(0, 0, -1);
  EXPECT_EQ(t.seq_len(0), 0);
  EXPECT_EQ(t.n_free_blocks(), 8);
  expect_consistent(t);
}

TEST(KvCacheTable, RemovingFromTheMiddleIsRefused) {
  KvCacheTable t(4, 4, 1);
  append(t, 0, 10);
  try {
    t.remove(0, 2, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("middle"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.seq_len(0), 10);
  EXPECT_THROW(t.remove(0, 5, 3), Error);
  EXPECT_THROW(t.remove(0, -1), Error);
}

TEST(KvCacheTable, ForkSharesBlocksWithoutCopying) {
  KvCacheTable t(16, 4, 4);
  append(t, 0, 8);  // two full blocks
  t.fork(0, 1);
  t.fork(0, 2);
  EXPECT_EQ(table(t, 1), table(t, 0));
  EXPECT_EQ(t.seq_len(2), 8);
  EXPECT_EQ(t.ref_count(0), 3);
  EXPECT_EQ(t.n_free_blocks(), 14);
  // full shared blocks are never written again: appending takes new blocks and copies nothing
  EXPECT_EQ(append(t, 1, 1), (std::vector<int32_t>{8}));
  EXPECT_EQ(append(t, 2, 1), (std::vector<int32_t>{12}));
  EXPECT_TRUE(t.pending_copies().empty());
  expect_consistent(t);
  // clearing the original leaves the forks intact
  t.clear(0);
  EXPECT_EQ(t.ref_count(0), 2);
  EXPECT_EQ(t.slot(1, 3), 3);
  expect_consistent(t);
}

TEST(KvCacheTable, WritingIntoASharedPartialBlockCopiesItFirst) {
  KvCacheTable t(16, 4, 3);
  append(t, 0, 6);  // block 0 full, block 1 holds positions 4, 5
  t.fork(0, 1);
  EXPECT_EQ(t.ref_count(1), 2);
  EXPECT_EQ(t.blocks_needed(1, 1), 1);  // the copy
  // seq 1 writes position 6 into the shared block: it gets block 2 with positions 4, 5 copied
  EXPECT_EQ(append(t, 1, 1), (std::vector<int32_t>{10}));
  ASSERT_EQ(t.pending_copies().size(), 1u);
  EXPECT_EQ(t.pending_copies()[0].src_block, 1);
  EXPECT_EQ(t.pending_copies()[0].dst_block, 2);
  EXPECT_EQ(t.pending_copies()[0].n_positions, 2);
  EXPECT_EQ(table(t, 1), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(t.ref_count(1), 2);  // seq 0 + the pending copy's hold
  expect_consistent(t);
  t.clear_pending_copies();
  EXPECT_EQ(t.ref_count(1), 1);
  // seq 0 is now the only holder of block 1 and writes in place
  EXPECT_EQ(t.blocks_needed(0, 1), 0);
  EXPECT_EQ(append(t, 0, 1), (std::vector<int32_t>{6}));
  EXPECT_TRUE(t.pending_copies().empty());
  expect_consistent(t);
}

TEST(KvCacheTable, PendingCopySourceSurvivesItsLastSequence) {
  KvCacheTable t(3, 4, 2);
  append(t, 0, 2);
  t.fork(0, 1);
  append(t, 1, 1);  // copy 0 -> 1
  t.clear(0);       // block 0 now only held by the pending copy
  EXPECT_EQ(t.ref_count(0), 1);
  EXPECT_EQ(t.n_free_blocks(), 1);  // block 2; block 0 must not be handed out yet
  EXPECT_EQ(append(t, 0, 1), (std::vector<int32_t>{8}));
  expect_consistent(t);
  t.clear_pending_copies();
  EXPECT_EQ(t.n_free_blocks(), 1);
  expect_consistent(t);
}

TEST(KvCacheTable, ForkOfAPrefixSharesOnlyTheCoveringBlocks) {
  KvCacheTable t(16, 4, 2);
  append(t, 0, 11);  // blocks 0, 1, 2
  t.fork(0, 1, 6);   // positions 0..5: blocks 0 and 1 (partial for seq 1)
  EXPECT_EQ(t.seq_len(1), 6);
  EXPECT_EQ(table(t, 1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(t.ref_count(2), 1);
  // seq 1 writing position 6 must not clobber seq 0's position 6 in block 1
  EXPECT_EQ(append(t, 1, 1), (std::vector<int32_t>{14}));
  ASSERT_EQ(t.pending_copies().size(), 1u);
  EXPECT_EQ(t.pending_copies()[0].n_positions, 2);
  t.clear_pending_copies();
  EXPECT_EQ(t.slot(0, 6), 6);
  expect_consistent(t);
  // forking over an existing sequence drops its old blocks
  t.fork(0, 1, 0);
  EXPECT_EQ(t.seq_len(1), 0);
  EXPECT_EQ(t.n_free_blocks(), 13);
  EXPECT_THROW(t.fork(0, 1, 12), Error);
  expect_consistent(t);
}

TEST(KvCacheTable, SpeculativeRollbackOfAForkedSequence) {
  KvCacheTable t(16, 4, 2);
  append(t, 0, 5);
  t.fork(0, 1);
  append(t, 1, 4);  // draft positions 5..8 (COW of block 1)
  t.clear_pending_copies();
  t.remove(1, 6);  // reject 6..8
  EXPECT_EQ(t.seq_len(1), 6);
  expect_consistent(t);
  append(t, 1, 2);  // block 2 is seq 1's own now: no copy
  EXPECT_TRUE(t.pending_copies().empty());
  expect_consistent(t);
}

TEST(KvCacheTable, FullCacheThrowsAClearErrorAndChangesNothing) {
  KvCacheTable t(4, 16, 2);
  append(t, 0, 40);  // 3 blocks
  try {
    append(t, 1, 17);  // needs 2
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "KV cache full: 3 of 4 blocks of 16 positions in use, 2 more needed; increase --ctx");
  }
  EXPECT_EQ(t.seq_len(1), 0);
  EXPECT_EQ(t.n_free_blocks(), 1);
  append(t, 1, 16);
  EXPECT_THROW(append(t, 0, 9), Error);  // 40 + 9 > 48
  append(t, 0, 8);
  EXPECT_EQ(t.n_free_blocks(), 0);
  expect_consistent(t);
  // a copy on write needs a block too
  KvCacheTable c(2, 4, 2);
  append(c, 0, 6);
  c.fork(0, 1);
  EXPECT_THROW(append(c, 1, 1), Error);
  expect_consistent(c);
}

TEST(KvCacheTable, BadSequenceIdsAndSizesAreRejected) {
  EXPECT_THROW(KvCacheTable(0, 16, 1), Error);
  EXPECT_THROW(KvCacheTable(4, 0, 1), Error);
  EXPECT_THROW(KvCacheTable(4, 16, 0), Error);
  KvCacheTable t(4, 16, 2);
  std::vector<int32_t> slots;
  EXPECT_THROW(t.append(2, 1, slots), Error);
  EXPECT_THROW(t.append(-1, 1, slots), Error);
  EXPECT_THROW(t.append(0, -1, slots), Error);
  EXPECT_THROW(t.fork(0, 5), Error);
  EXPECT_THROW(t.clear(7), Error);
}

// A random walk of operations keeps the invariants, and every sequence's slots stay distinct from every other
// sequence's slots beyond their shared prefix.
TEST(KvCacheTable, RandomOperationsKeepTheInvariants) {
  KvCacheTable t(64, 8, 6);
  uint64_t state = 12345;
  auto rnd = [&](int n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int((state >> 33) % uint64_t(n));
  };
  for (int step = 0; step < 2000; ++step) {
    const int op = rnd(10);
    const int s = rnd(6);
    try {
      if (op < 5) {
        append(t, s, 1 + rnd(12));
      } else if (op < 7) {
        t.remove(s, rnd(t.seq_len(s) + 1));
      } else if (op < 9) {
        const int d = rnd(6);
        t.fork(s, d, rnd(t.seq_len(s) + 1));
      } else {
        t.clear(s);
      }
    } catch (const Error&) {
      // cache full: fine, nothing changed
    }
    if (rnd(3) == 0) t.clear_pending_copies();
    expect_consistent(t);
    // no two sequences own the same slot of an unshared (ref 1) block
    std::set<int32_t> owned;
    for (int32_t q = 0; q < t.max_seqs(); ++q)
      for (int32_t b : t.block_table(q))
        if (t.ref_count(b) == 1) {
          ASSERT_TRUE(owned.insert(b).second) << "block " << b << " held twice";
        }
    if (HasFailure()) break;
  }
}

TEST(KvStorage, CopiesTheLeadingSlotsOfABlockInEveryLayer) {
  auto dev = create_device(DeviceId{DeviceKind::CPU, 0});
  const std::vector<KvLayerShape> layers = {{4, 2, 2}, {8, 4, 1}};
  KvStorage st(*dev, layers, DType::F32, DType::F16, 3, 4);
  ASSERT_EQ(st.layers().size(), 2u);
  EXPECT_EQ(st.layer(1).k.shape_string(), "{8, 1, 4, 3}");
  EXPECT_EQ(st.layer(1).v.type, DType::F16);
  EXPECT_EQ(st.bytes(), KvStorage::bytes_per_position(layers, DType::F32, DType::F16) * 12);
  // distinct bytes everywhere
  for (const KvLayerView& l : st.layers())
    for (const Tensor* t : {&l.k, &l.v}) {
      auto* p = static_cast<uint8_t*>(t->data);
      for (size_t i = 0; i < t->nbytes(); ++i) p[i] = uint8_t(i * 7 + 3);
    }
  std::vector<std::vector<uint8_t>> before;
  for (const KvLayerView& l : st.layers())
    for (const Tensor* t : {&l.k, &l.v})
      before.emplace_back(static_cast<uint8_t*>(t->data), static_cast<uint8_t*>(t->data) + t->nbytes());
  const BlockCopy copy{2, 0, 3};  // slots 8..10 -> 0..2
  st.apply_copies(dev->default_stream(), std::span(&copy, 1));
  size_t k = 0;
  for (const KvLayerView& l : st.layers())
    for (const Tensor* t : {&l.k, &l.v}) {
      const auto* p = static_cast<const uint8_t*>(t->data);
      const size_t slot = t->nb[2], block = t->nb[3];
      for (size_t i = 0; i < t->nbytes(); ++i) {
        const size_t expect_from =
            i < 3 * slot ? 2 * block + i : i;  // the first 3 slots of block 0 are copied
        ASSERT_EQ(p[i], before[k][expect_from]) << "byte " << i;
      }
      ++k;
    }
  EXPECT_THROW(KvStorage(*dev, layers, DType::Q8_0, DType::F16, 3, 4), Error);
}

}  // namespace
}  // namespace tandem
