// Paged KV cache bookkeeping (host side). The cache is n_blocks blocks of block_size positions, shared by all
// sequences of a session; each sequence has a block table (logical block -> physical block). Position j of
// sequence s lives in physical slot table[j / block_size] * block_size + j % block_size of every layer's
// storage (KvLayerView in backend/backend.h; the storage itself is KvStorage in runtime/kv_storage.h).
//
// Blocks are reference counted, so forking a sequence (parallel decoding of one prompt, a draft branch)
// shares the blocks instead of copying them. A full block is never written again, so sharing it is free; the
// partly filled last block is copied on write: when a sequence appends into a last block that another
// sequence also uses, it gets a fresh block and a BlockCopy is queued, which the owner of the storage must
// apply (copy the first n_positions slots of src into dst in every layer) before the new positions are
// written.
//
// Sequences hold contiguous positions 0..len-1 (cache position == token position, which the attention mask
// relies on); positions are removed from the end only (speculative rollback), never from the middle. The
// table of a sliding-window KV group also drops whole blocks from the front of a sequence (evict_before):
// their entries in the block table are -1.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

struct BlockCopy {
  int32_t src_block;
  int32_t dst_block;
  int32_t n_positions;  // leading positions of the block to copy
};

class KvCacheTable {
 public:
  // n_blocks blocks of block_size positions, for sequence ids 0..max_seqs-1. Throws Error on sizes < 1.
  KvCacheTable(int32_t n_blocks, int32_t block_size, int32_t max_seqs);

  int32_t n_blocks() const { return int32_t(ref_count_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t max_seqs() const { return int32_t(seqs_.size()); }
  int32_t n_free_blocks() const { return int32_t(free_.size()); }
  int32_t n_used_blocks() const { return n_blocks() - n_free_blocks(); }
  int32_t ref_count(int32_t block) const;

  // Number of cached positions of a sequence.
  int32_t seq_len(int32_t seq) const;
  // Physical blocks of a sequence, in logical order (ceil(seq_len / block_size) of them).
  std::span<const int32_t> block_table(int32_t seq) const;
  // Physical slot of position pos (< seq_len) of seq.
  int32_t slot(int32_t seq, int32_t pos) const;

  // Blocks that appending n positions to seq would take from the free list (including a copy-on-write block).
  int32_t blocks_needed(int32_t seq, int32_t n) const;

  // Adds positions [seq_len, seq_len + n) to seq and appends their physical slots to `slots`. Either succeeds
  // completely or throws Error (cache full, bad sequence id) and changes nothing. May queue a BlockCopy.
  void append(int32_t seq, int32_t n, std::vector<int32_t>& slots);

  // Removes positions [p0, p1) of seq; p1 < 0 means "to the end". The range must reach the end of the
  // sequence (p1 >= seq_len or p1 < 0): positions can only be removed from the end. Blocks no longer used
  // return to the free list when no other sequence holds them. p0 >= seq_len is a no-op.
  void remove(int32_t seq, int32_t p0, int32_t p1 = -1);
  // The checks of remove() alone (throws Error; changes nothing).
  void check_remove(int32_t seq, int32_t p0, int32_t p1 = -1) const;

  // Makes dst hold the first n_positions positions of src (all of them when n_positions < 0) by sharing src's
  // blocks; dst's previous contents are dropped first. No data is copied now (copy on write later).
  void fork(int32_t src, int32_t dst, int32_t n_positions = -1);

  void clear(int32_t seq);
  void clear_all();

  // Sliding-window layers: frees the blocks of seq that hold only positions < pos (their block table entries
  // become -1; the positions still count in seq_len). Forks share the evicted state.
  void evict_before(int32_t seq, int32_t pos);
  // The first position of seq whose block is still held (0 when nothing was evicted).
  int32_t first_kept(int32_t seq) const;

  // Copies queued by append() that the storage owner has not applied yet, oldest first. The source block of a
  // pending copy keeps one extra reference until clear_pending_copies(), so it cannot be reused and
  // overwritten before the copy has been made.
  std::span<const BlockCopy> pending_copies() const { return pending_copies_; }
  // Call after applying pending_copies(): drops the queue and the references it held.
  void clear_pending_copies();

  // "KV cache full: 30 of 32 blocks of 16 positions in use, 5 more needed; increase --ctx".
  std::string full_message(int32_t needed) const;

 private:
  struct Seq {
    int32_t len = 0;
    std::vector<int32_t> blocks;
  };
  void check_seq(int32_t seq) const;
  int32_t take_block();
  void release_block(int32_t block);

  int32_t block_size_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> ref_count_;
  std::vector<int32_t> free_;  // a stack; the lowest ids are handed out first
  std::vector<BlockCopy> pending_copies_;
};

}  // namespace tandem
