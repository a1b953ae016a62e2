// The host half of a step: checks a batch before anything changes, gives every row its KV slots in each KV
// group (global layers, and one group per sliding-window size), and computes each row's attention bounds for
// the batch's mask kind. Nothing here touches a device; session.cpp uploads the staging and runs the ranks.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "runtime/session_impl.h"

namespace tandem {

namespace {

std::string row_str(size_t r) {
  return "batch row " + std::to_string(r);
}

bool needs_one_pass(const Batch& b) {
  return b.mask.kind != AttentionMask::Causal;
}

}  // namespace

void Session::Impl::validate(const Batch& batch) {
  const size_t n = batch.size();
  check(n > 0, "cannot decode an empty batch");
  check(tap_layers.empty() || tap_dst.n_rows <= 0 || int64_t(n) <= tap_dst.n_rows,
        "a batch of " + std::to_string(n) + " rows exceeds the " + std::to_string(tap_dst.n_rows) +
            " rows of the tap destination (a DFlash drafter's feature buffer holds the target's n_batch rows)");
  check(batch.seq_ids.size() == n && batch.logits.size() == n,
        "batch has " + std::to_string(n) + " positions but " + std::to_string(batch.seq_ids.size()) +
            " sequence ids and " + std::to_string(batch.logits.size()) + " logit flags");
  check(
      batch.tokens.empty() || batch.tokens.size() == n,
      "batch has " + std::to_string(batch.tokens.size()) + " tokens for " + std::to_string(n) + " positions");
  check(batch.embd_rows.empty() || batch.embd_rows.size() == n,
        "batch has " + std::to_string(batch.embd_rows.size()) + " embedding row indices for " +
            std::to_string(n) + " positions");
  check(batch.kv_write.empty() || batch.kv_write.size() == n,
        "batch has " + std::to_string(batch.kv_write.size()) + " kv_write flags for " + std::to_string(n) +
            " positions");

  // Where each row's added embedding comes from.
  const bool device_source = batch.embedding_source.data != nullptr;
  int64_t n_src = 0;
  if (device_source) {
    check(batch.embeddings.empty(),
          "a batch takes its embedding rows either from host `embeddings` or from "
          "an embedding_source, not both");
    n_src = batch.embedding_source.n_rows;
    check(n_src >= 1, "the batch's embedding_source has no rows");
    check(batch.embedding_source.row_stride == 0 ||
              batch.embedding_source.row_stride >= size_t(n_embd_added) * sizeof(float),
          "the batch's embedding_source row stride is smaller than one row of " + std::to_string(n_embd_added) +
              " floats");
  } else {
    check(batch.embeddings.size() % size_t(n_embd_added) == 0,
          "batch embeddings hold " + std::to_string(batch.embeddings.size()) +
              " values, not a multiple of the row width " + std::to_string(n_embd_added));
    n_src = int64_t(batch.embeddings.size()) / n_embd_added;
  }
  const bool implied_rows = batch.tokens.empty() && batch.embd_rows.empty();  // row r reads host row r
  if (implied_rows)
    check(!device_source && n_src == int64_t(n),
          "batch rows need either token ids or " + std::to_string(n_embd_added) + " embedding values each");

  h_tokens.assign(n, kNoToken);
  h_added_rows.assign(n, -1);
  for (size_t r = 0; r < n; ++r) {
    const int32_t t = batch.token(r);
    const int32_t e = implied_rows ? int32_t(r) : batch.embd_row(r);
    check(t == kNoToken || (t >= 0 && t < n_token_ids),
          "token id " + std::to_string(t) + " is out of range: the vocabulary has " +
              std::to_string(n_token_ids) + " tokens (0.." + std::to_string(n_token_ids - 1) + ")");
    check(e >= -1 && e < n_src, row_str(r) + ": embedding row " + std::to_string(e) +
                                    " is out of range: the batch has " + std::to_string(n_src) +
                                    " embedding rows");
    check(t != kNoToken || e >= 0, row_str(r) + " has neither a token nor an embedding row");
    h_tokens[r] = t;
    h_added_rows[r] = e;
  }
  if (feature_rows) {
    // A DFlash drafter: feature rows inject K/V from the target's features, token rows run the draft block;
    // one forward pass is one or the other (the two are different graphs).
    size_t n_feat = 0;
    for (size_t r = 0; r < n; ++r) {
      const bool feat = h_added_rows[r] >= 0;
      check(!feat || h_tokens[r] == kNoToken,
            row_str(r) + " has both a token and a feature row; a feature row carries no token");
      check(!feat || !batch.logits[r], row_str(r) + " is a feature row and computes no logits");
      n_feat += feat ? 1 : 0;
    }
    check(n_feat == 0 || n_feat == n,
          "the batch mixes " + std::to_string(n_feat) + " feature rows with " + std::to_string(n - n_feat) +
              " token rows; a drafter's batch holds target-feature rows only (K/V injection) or token rows "
              "only (the draft block)");
  }

  // Sequences and positions.
  std::fill(seq_count.begin(), seq_count.end(), 0);
  std::fill(seq_writes.begin(), seq_writes.end(), 1);
  const KvCacheTable& t0 = *groups.front().table;
  for (int32_t s = 0; s < params.n_seq_max; ++s) seq_next[size_t(s)] = seq_base[size_t(s)] = t0.seq_len(s);
  size_t n_out_rows = 0, n_quiet = 0;
  for (size_t r = 0; r < n; ++r) {
    const int32_t s = batch.seq_ids[r];
    check(s >= 0 && s < params.n_seq_max, row_str(r) + ": sequence id " + std::to_string(s) +
                                              " is out of range (this session has " +
                                              std::to_string(params.n_seq_max) + " sequences)");
    check(batch.positions[r] == seq_next[size_t(s)],
          row_str(r) + ": position " + std::to_string(batch.positions[r]) + " does not continue sequence " +
              std::to_string(s) + ", whose next position is " + std::to_string(seq_next[size_t(s)]));
    const uint8_t w = batch.writes_kv(r) ? 1 : 0;
    if (seq_count[size_t(s)] == 0) seq_writes[size_t(s)] = w;
    check(seq_writes[size_t(s)] == w, row_str(r) + ": the rows of sequence " + std::to_string(s) +
                                          " in one batch must all write K/V or all not write it");
    ++seq_next[size_t(s)];
    ++seq_count[size_t(s)];
    n_out_rows += batch.logits[r] ? 1 : 0;
    n_quiet += w ? 0 : 1;
  }

  // The mask.
  const BatchMask& mk = batch.mask;
  const bool one_pass = n_quiet > 0 || needs_one_pass(batch);
  if (one_pass)
    check(
        n <= size_t(params.n_batch) && n_out_rows <= size_t(params.n_logits_max),
        "a batch with non-causal attention or rows that write no K/V must fit in one forward pass: it has " +
            std::to_string(n) + " rows (--batch " + std::to_string(params.n_batch) + ") and " +
            std::to_string(n_out_rows) + " logit rows (at most " + std::to_string(params.n_logits_max) + ")");
  switch (mk.kind) {
    case AttentionMask::Causal:
      break;
    case AttentionMask::BlockBidirectional:
      check(mk.block_size >= 0,
            "block-bidirectional mask: block_size must be >= 0, got " + std::to_string(mk.block_size));
      break;
    case AttentionMask::PrefixRegion:
      check(mk.prefix_len >= 0,
            "prefix-region mask: prefix_len must be >= 0, got " + std::to_string(mk.prefix_len));
      break;
    case AttentionMask::Explicit:
      check(params.explicit_mask_cols > 0,
            "explicit attention masks need a session created with explicit_mask_cols > 0");
      check(mk.mask_cols >= 1 && mk.mask_cols <= params.explicit_mask_cols,
            "explicit mask: mask_cols must be in [1, " + std::to_string(params.explicit_mask_cols) +
                "], got " + std::to_string(mk.mask_cols));
      check(mk.explicit_mask.size() == n * size_t(mk.mask_cols),
            "explicit mask holds " + std::to_string(mk.explicit_mask.size()) + " values; " +
                std::to_string(n) + " rows x " + std::to_string(mk.mask_cols) + " columns expected");
      for (float v : mk.explicit_mask)
        check(!std::isnan(v) && v != INFINITY, "explicit mask values must be finite or -inf");
      break;
  }
  check(n_quiet <= size_t(params.n_batch), "too many rows that write no K/V in one batch");

  // Room in the cache: groups that keep every position need blocks for the writing rows.
  for (const KvGroup& g : groups) {
    if (g.evicts) continue;  // sized so that it cannot run out (see the constructor)
    int64_t needed = 0;
    for (int32_t s = 0; s < params.n_seq_max; ++s)
      if (seq_count[size_t(s)] > 0 && seq_writes[size_t(s)])
        needed += g.table->blocks_needed(s, seq_count[size_t(s)]);
    const int64_t usable = int64_t(g.table->n_free_blocks()) - g.reserve_blocks;
    check(needed <= usable, g.table->full_message(int32_t(std::min<int64_t>(needed, INT32_MAX))));
  }
}

void Session::Impl::plan_chunk(const Batch& batch, size_t r0, size_t r1) {
  const size_t T = r1 - r0;
  const int32_t S = params.n_seq_max;
  std::vector<int32_t>& count = chunk_count;  // members: no allocation per step
  std::vector<int32_t>& first_pos = chunk_first_pos;
  count.assign(size_t(S), 0);
  first_pos.assign(size_t(S), 0);
  for (size_t r = r0; r < r1; ++r) {
    const int32_t s = batch.seq_ids[r];
    if (count[size_t(s)]++ == 0) first_pos[size_t(s)] = batch.positions[r];
  }
  auto table_seq = [&](int32_t s) { return seq_writes[size_t(s)] ? s : S + s; };

  h_seq_slot.resize(T);
  for (size_t r = r0; r < r1; ++r) h_seq_slot[r - r0] = table_seq(batch.seq_ids[r]);

  for (KvGroup& g : groups) {
    KvCacheTable& tb = *g.table;
    for (auto& v : g.seq_slots) v.clear();
    for (int32_t s = 0; s < S; ++s) {
      if (count[size_t(s)] == 0) continue;
      const int32_t ts = table_seq(s);
      if (ts != s) tb.fork(s, ts);  // non-writing rows: a scratch copy sharing s's blocks (copy on write)
      tb.append(ts, count[size_t(s)], g.seq_slots[size_t(ts)]);
    }
    g.h_slots.resize(T);
    std::vector<int32_t>& cursor = chunk_cursor;
    cursor.assign(size_t(n_table_seqs()), 0);
    for (size_t r = r0; r < r1; ++r) {
      const int32_t ts = h_seq_slot[r - r0];
      g.h_slots[r - r0] = g.seq_slots[size_t(ts)][size_t(cursor[size_t(ts)]++)];
    }
    std::fill(g.h_block_tables.begin(), g.h_block_tables.end(), 0);
    for (int32_t ts = 0; ts < n_table_seqs(); ++ts) {
      g.h_seq_lens[size_t(ts)] = tb.seq_len(ts);
      auto bt = tb.block_table(ts);
      check(int64_t(bt.size()) <= max_blocks_per_seq, "internal: a block table outgrew its row");
      std::copy(bt.begin(), bt.end(), g.h_block_tables.begin() + ptrdiff_t(ts) * max_blocks_per_seq);
    }
    // PrefixRegion on a sliding layer: prompt rows see their window, canvas rows every canvas position and
    // the prompt positions >= prefix_len - window + 1 (GGUF-ARCH-FACTS D.3); both as a per-row lower bound.
    g.h_kv_begin.clear();
    if (batch.mask.kind == AttentionMask::PrefixRegion && g.window > 0) {
      g.h_kv_begin.resize(T);
      const int32_t P = batch.mask.prefix_len;
      for (size_t r = r0; r < r1; ++r) {
        const int32_t p = batch.positions[r];
        g.h_kv_begin[r - r0] = std::max(0, (p < P ? p : P) - g.window + 1);
      }
    }
  }

  // Upper bounds of the block-shaped masks (the same in every group).
  h_block_end.clear();
  const BatchMask& mk = batch.mask;
  if (mk.kind == AttentionMask::BlockBidirectional || mk.kind == AttentionMask::PrefixRegion) {
    h_block_end.resize(T);
    for (size_t r = r0; r < r1; ++r) {
      const int32_t s = batch.seq_ids[r], p = batch.positions[r];
      const int32_t q0 = first_pos[size_t(s)], end = q0 + count[size_t(s)];
      int32_t e = end;
      if (mk.kind == AttentionMask::BlockBidirectional && mk.block_size > 0)
        e = std::min(end, q0 + ((p - q0) / mk.block_size + 1) * mk.block_size);
      if (mk.kind == AttentionMask::PrefixRegion && p < mk.prefix_len) e = p + 1;
      h_block_end[r - r0] = e;
    }
  }

  h_out_rows.clear();
  for (size_t r = r0; r < r1; ++r)
    if (batch.logits[r]) h_out_rows.push_back(int32_t(r - r0));
}

void Session::Impl::finish_chunk() {
  const int32_t S = params.n_seq_max;
  for (KvGroup& g : groups) {
    for (int32_t s = 0; s < S; ++s)
      if (g.table->seq_len(S + s) > 0) g.table->clear(S + s);
    if (!g.evicts) continue;
    // Keep the window plus one batch of positions, so that a rollback of up to n_batch positions still
    // finds its window (seq_remove refuses more).
    for (int32_t s = 0; s < S; ++s) {
      const int32_t len = g.table->seq_len(s);
      if (len > 0) g.table->evict_before(s, len - g.window - params.n_batch);
    }
  }
}

void Session::Impl::rollback() {
  const int32_t S = params.n_seq_max;
  for (KvGroup& g : groups) {
    g.table->clear_pending_copies();
    for (int32_t s = 0; s < S; ++s)
      if (g.table->seq_len(S + s) > 0) g.table->clear(S + s);
  }
  for (int32_t s = 0; s < S; ++s) {
    if (seq_count[size_t(s)] == 0 || !seq_writes[size_t(s)]) continue;
    bool lost = false;  // a sliding group already dropped positions the old end needs
    for (const KvGroup& g : groups)
      if (g.evicts && g.table->first_kept(s) > std::max(0, seq_base[size_t(s)] - g.window)) lost = true;
    for (KvGroup& g : groups) {
      if (lost)
        g.table->clear(s);
      else
        g.table->remove(s, seq_base[size_t(s)]);
    }
  }
}

}  // namespace tandem
