// A batch for Session::decode: the rows of one forward step and the attention mask they use.
//
// Per row:
//   token      a token id, or kNoToken: the row's input is then its added embedding alone;
//   embedding  optionally, a row of F32 values (n_embd) ADDED to the scaled token embedding:
//              input = embed(token) * model scale + added (self-conditioning needs exactly this). The rows
//              come from the batch's host `embeddings`, or from a device buffer (`embedding_source`: e.g.
//              another model's output, a drafter's features) named by row index, so they never cross to the
//              host;
//   position   the row's position in its sequence;
//   sequence   its sequence id;
//   kv_write   whether its K/V are stored in the cache. A row that does not write (a diffusion canvas row in
//              DECODE, a throw-away draft row) still attends to its own sequence's cache and to the other
//              non-writing rows of its sequence in this batch; after the step the cache is exactly as before;
//   logits     whether its logits are computed (a prompt wants only its last row).
//
// The rows of one sequence continue it: positions seq_len, seq_len + 1, ... in row order. Within one batch a
// sequence's rows either all write K/V or none do. Rows of different sequences may be mixed in any order.
//
// The mask (BatchMask) says which cache positions j of its sequence a row at position p sees; every kind is
// computed inside the attention kernels from per-row bounds (no mask matrix), except Explicit:
//   Causal              j <= p
//   BlockBidirectional  the rows of a block see each other and all positions before the block (DFlash draft
//                       blocks): block_size = 0 makes a sequence's rows of this batch one block; block_size >
//                       0 cuts them into blocks of block_size rows
//   PrefixRegion        rows at p < prefix_len (the prompt) are causal; rows at p >= prefix_len (the canvas)
//   see
//                       every position of the sequence up to the end of this batch (diffusion)
//   Explicit            an additive bias per (row, position): explicit_mask[r * mask_cols + j], -inf hides;
//                       positions j >= mask_cols are hidden
// A model's sliding-window layers further hide positions j <= p - window (PrefixRegion canvas rows instead
// see only prompt positions >= prefix_len - window + 1, and every canvas position).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace tandem {

inline constexpr int32_t kNoToken = -1;

enum class AttentionMask { Causal, BlockBidirectional, PrefixRegion, Explicit };

struct BatchMask {
  AttentionMask kind = AttentionMask::Causal;
  int32_t block_size = 0;  // BlockBidirectional: rows per block; 0 = a sequence's rows form one block
  int32_t prefix_len = 0;  // PrefixRegion: positions < prefix_len are prompt rows
  int32_t mask_cols = 0;   // Explicit: columns (cache positions 0 .. mask_cols - 1) of explicit_mask
  std::vector<float> explicit_mask;  // Explicit: {mask_cols} per row, row after row
};

// Rows of F32 values (n_embd each) that batch rows can name by index: a device buffer (or host memory when
// device is a CPU device). It must stay valid until the decode that reads it has finished.
struct EmbeddingSource {
  DeviceId device{};
  const void* data = nullptr;
  int64_t n_rows = 0;
  size_t row_stride = 0;  // bytes between rows; 0 = n_embd * 4
};

struct Batch {
  std::vector<int32_t> tokens;  // one per row (kNoToken: none); empty = no row has a token
  std::vector<int32_t>
      embd_rows;  // one per row: row of the embedding source added to it, -1 = none; empty = none
  std::vector<float> embeddings;     // host source rows, n_embd values each (used when embedding_source is
                                     // unset); with no tokens and no embd_rows, row r reads host row r
  EmbeddingSource embedding_source;  // a device source instead of `embeddings`
  std::vector<int32_t> positions;    // one per row
  std::vector<int32_t> seq_ids;      // one per row
  std::vector<uint8_t> logits;       // one per row: 1 = return this row's logits
  std::vector<uint8_t> kv_write;     // one per row: 0 = do not keep its K/V; empty = every row writes
  BatchMask mask;

  size_t size() const { return positions.size(); }
  bool empty() const { return positions.empty(); }
  bool writes_kv(size_t row) const { return kv_write.empty() || kv_write[row] != 0; }
  int32_t token(size_t row) const { return tokens.empty() ? kNoToken : tokens[row]; }
  int32_t embd_row(size_t row) const { return embd_rows.empty() ? -1 : embd_rows[row]; }
  void clear() {
    tokens.clear();
    embd_rows.clear();
    embeddings.clear();
    embedding_source = {};
    positions.clear();
    seq_ids.clear();
    logits.clear();
    kv_write.clear();
    mask = {};
  }
  // A row with a token (and, with embd_row >= 0, an added embedding row).
  void add(int32_t token, int32_t pos, int32_t seq, bool want_logits, bool write_kv = true,
           int32_t embd_row = -1) {
    push_row(token, embd_row, pos, seq, want_logits, write_kv);
  }
  // A row whose input is `embedding` alone (n_embd values), kept in the batch's host rows.
  void add_embedding(std::span<const float> embedding, int32_t pos, int32_t seq, bool want_logits,
                     bool write_kv = true) {
    const size_t n_embd = embedding.size();
    const int32_t index = n_embd == 0 ? 0 : int32_t(embeddings.size() / n_embd);
    embeddings.insert(embeddings.end(), embedding.begin(), embedding.end());
    push_row(kNoToken, index, pos, seq, want_logits, write_kv);
  }
  // Adds tokens[i] at positions pos0 + i of one sequence; only the last row wants logits if last_logits.
  void add_sequence(std::span<const int32_t> toks, int32_t pos0, int32_t seq, bool last_logits) {
    for (size_t i = 0; i < toks.size(); ++i)
      add(toks[i], pos0 + int32_t(i), seq, last_logits && i + 1 == toks.size());
  }

 private:
  void push_row(int32_t token, int32_t embd_row, int32_t pos, int32_t seq, bool want_logits, bool write_kv) {
    const size_t n = positions.size();
    if (token != kNoToken || !tokens.empty()) {
      tokens.resize(n, kNoToken);
      tokens.push_back(token);
    }
    if (embd_row >= 0 || !embd_rows.empty()) {
      embd_rows.resize(n, -1);
      embd_rows.push_back(embd_row);
    }
    if (!write_kv || !kv_write.empty()) {
      kv_write.resize(n, 1);
      kv_write.push_back(write_kv ? 1 : 0);
    }
    positions.push_back(pos);
    seq_ids.push_back(seq);
    logits.push_back(want_logits ? 1 : 0);
  }
};

}  // namespace tandem
