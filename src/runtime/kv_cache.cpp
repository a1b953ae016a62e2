#include "runtime/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

KvCacheTable::KvCacheTable(int32_t n_blocks, int32_t block_size, int32_t max_seqs) : block_size_(block_size) {
  check(n_blocks >= 1, "the KV cache needs at least one block");
  check(block_size >= 1, "the KV cache block size must be at least 1");
  check(max_seqs >= 1, "the KV cache needs room for at least one sequence");
  seqs_.resize(size_t(max_seqs));
  ref_count_.assign(size_t(n_blocks), 0);
  free_.reserve(size_t(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void KvCacheTable::check_seq(int32_t seq) const {
  check(seq >= 0 && seq < max_seqs(), "sequence id " + std::to_string(seq) +
                                          " is out of range: this session has " + std::to_string(max_seqs()) +
                                          " sequence slots (0.." + std::to_string(max_seqs() - 1) + ")");
}

int32_t KvCacheTable::ref_count(int32_t block) const {
  check(block >= 0 && block < n_blocks(), "KV block " + std::to_string(block) + " does not exist");
  return ref_count_[size_t(block)];
}

int32_t KvCacheTable::seq_len(int32_t seq) const {
  check_seq(seq);
  return seqs_[size_t(seq)].len;
}

std::span<const int32_t> KvCacheTable::block_table(int32_t seq) const {
  check_seq(seq);
  return seqs_[size_t(seq)].blocks;
}

int32_t KvCacheTable::slot(int32_t seq, int32_t pos) const {
  check_seq(seq);
  const Seq& s = seqs_[size_t(seq)];
  check(pos >= 0 && pos < s.len, "position " + std::to_string(pos) + " is not cached in sequence " +
                                     std::to_string(seq) + " (length " + std::to_string(s.len) + ")");
  return s.blocks[size_t(pos / block_size_)] * block_size_ + pos % block_size_;
}

int32_t KvCacheTable::take_block() {
  const int32_t b = free_.back();
  free_.pop_back();
  ref_count_[size_t(b)] = 1;
  return b;
}

void KvCacheTable::release_block(int32_t block) {
  if (block < 0) return;  // evicted
  int32_t& rc = ref_count_[size_t(block)];
  if (--rc == 0) free_.push_back(block);
}

int32_t KvCacheTable::blocks_needed(int32_t seq, int32_t n) const {
  check_seq(seq);
  check(n >= 0, "cannot append a negative number of positions");
  const Seq& s = seqs_[size_t(seq)];
  const int64_t total_blocks = (int64_t(s.len) + n + block_size_ - 1) / block_size_;
  int64_t needed = total_blocks - int64_t(s.blocks.size());
  const bool writes_partial_last = n > 0 && s.len % block_size_ != 0;
  if (writes_partial_last && ref_count_[size_t(s.blocks.back())] > 1) ++needed;  // copy on write
  return int32_t(std::min<int64_t>(needed, INT32_MAX));
}

std::string KvCacheTable::full_message(int32_t needed) const {
  return "KV cache full: " + std::to_string(n_used_blocks()) + " of " + std::to_string(n_blocks()) +
         " blocks of " + std::to_string(block_size_) + " positions in use, " + std::to_string(needed) +
         " more needed; increase --ctx";
}

void KvCacheTable::append(int32_t seq, int32_t n, std::vector<int32_t>& slots) {
  const int32_t needed = blocks_needed(seq, n);
  check(needed <= n_free_blocks(), full_message(needed));
  if (n == 0) return;
  Seq& s = seqs_[size_t(seq)];
  const int32_t offset = s.len % block_size_;
  if (offset != 0 && ref_count_[size_t(s.blocks.back())] > 1) {
    // Copy on write. The source keeps this sequence's reference until the copy has been applied
    // (clear_pending_copies), so nobody can reuse and overwrite it in between.
    const int32_t src = s.blocks.back();
    const int32_t dst = take_block();
    pending_copies_.push_back({src, dst, offset});
    s.blocks.back() = dst;
  }
  slots.reserve(slots.size() + size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = s.len + i;
    if (pos % block_size_ == 0) s.blocks.push_back(take_block());
    slots.push_back(s.blocks[size_t(pos / block_size_)] * block_size_ + pos % block_size_);
  }
  s.len += n;
}

void KvCacheTable::check_remove(int32_t seq, int32_t p0, int32_t p1) const {
  check_seq(seq);
  const Seq& s = seqs_[size_t(seq)];
  check(p0 >= 0, "cannot remove positions from " + std::to_string(p0) + ": positions start at 0");
  if (p1 >= 0) check(p1 >= p0, "bad position range [" + std::to_string(p0) + ", " + std::to_string(p1) + ")");
  if (p0 >= s.len || p1 == p0) return;
  check(p1 < 0 || p1 >= s.len, "cannot remove positions [" + std::to_string(p0) + ", " + std::to_string(p1) +
                                   ") from the middle of sequence " + std::to_string(seq) + " (length " +
                                   std::to_string(s.len) + "): only a tail [p0, end) can be removed");
}

void KvCacheTable::remove(int32_t seq, int32_t p0, int32_t p1) {
  check_remove(seq, p0, p1);
  Seq& s = seqs_[size_t(seq)];
  if (p0 >= s.len || p1 == p0) return;
  const size_t keep_blocks = size_t((p0 + block_size_ - 1) / block_size_);
  for (size_t i = keep_blocks; i < s.blocks.size(); ++i) release_block(s.blocks[i]);
  s.blocks.resize(keep_blocks);
  s.len = p0;
}

void KvCacheTable::fork(int32_t src, int32_t dst, int32_t n_positions) {
  check_seq(src);
  check_seq(dst);
  if (src == dst) {
    if (n_positions >= 0) remove(dst, n_positions);
    return;
  }
  const Seq& from = seqs_[size_t(src)];
  const int32_t n = n_positions < 0 ? from.len : n_positions;
  check(n <= from.len, "cannot fork " + std::to_string(n) + " positions of sequence " + std::to_string(src) +
                           ", which has " + std::to_string(from.len));
  clear(dst);
  Seq& to = seqs_[size_t(dst)];
  const size_t n_blocks_shared = size_t((n + block_size_ - 1) / block_size_);
  to.blocks.assign(from.blocks.begin(), from.blocks.begin() + ptrdiff_t(n_blocks_shared));
  for (int32_t b : to.blocks)
    if (b >= 0) ++ref_count_[size_t(b)];
  to.len = n;
}

void KvCacheTable::clear_pending_copies() {
  for (const BlockCopy& c : pending_copies_) release_block(c.src_block);
  pending_copies_.clear();
}

void KvCacheTable::clear(int32_t seq) {
  check_seq(seq);
  Seq& s = seqs_[size_t(seq)];
  for (int32_t b : s.blocks) release_block(b);
  s.blocks.clear();
  s.len = 0;
}

void KvCacheTable::evict_before(int32_t seq, int32_t pos) {
  check_seq(seq);
  Seq& s = seqs_[size_t(seq)];
  const size_t n = std::min(s.blocks.size(), size_t(std::max(0, pos) / block_size_));
  for (size_t i = 0; i < n; ++i) {
    release_block(s.blocks[i]);
    s.blocks[i] = -1;
  }
}

int32_t KvCacheTable::first_kept(int32_t seq) const {
  check_seq(seq);
  const Seq& s = seqs_[size_t(seq)];
  size_t i = 0;
  while (i < s.blocks.size() && s.blocks[i] < 0) ++i;
  return int32_t(i) * block_size_;
}

void KvCacheTable::clear_all() {
  for (int32_t i = 0; i < max_seqs(); ++i) clear(i);
}

}  // namespace tandem
