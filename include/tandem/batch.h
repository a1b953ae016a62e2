// A batch for Session::decode: rows of token ids (or of input embeddings), each with its position, its
// sequence id, and whether the caller wants its logits.
//
// Rows of different sequences may be mixed in any order; the rows of one sequence must continue it: positions
// seq_len, seq_len + 1, ... in row order (the paged KV cache keeps positions contiguous). Only rows marked
// for logits compute the model's head.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

struct Batch {
  std::vector<int32_t> tokens;     // one per row; empty when the rows are embeddings
  std::vector<float> embeddings;   // n_embd values per row, when the rows are embeddings
  std::vector<int32_t> positions;  // one per row
  std::vector<int32_t> seq_ids;    // one per row
  std::vector<uint8_t> logits;     // one per row: 1 = return this row's logits

  size_t size() const { return positions.size(); }
  bool empty() const { return positions.empty(); }
  void clear() {
    tokens.clear();
    embeddings.clear();
    positions.clear();
    seq_ids.clear();
    logits.clear();
  }
  void add(int32_t token, int32_t pos, int32_t seq, bool want_logits) {
    tokens.push_back(token);
    positions.push_back(pos);
    seq_ids.push_back(seq);
    logits.push_back(want_logits ? 1 : 0);
  }
  void add_embedding(std::span<const float> embedding, int32_t pos, int32_t seq, bool want_logits) {
    embeddings.insert(embeddings.end(), embedding.begin(), embedding.end());
    positions.push_back(pos);
    seq_ids.push_back(seq);
    logits.push_back(want_logits ? 1 : 0);
  }
  // Adds tokens[i] at positions pos0 + i of one sequence; only the last row wants logits if last_logits.
  void add_sequence(std::span<const int32_t> toks, int32_t pos0, int32_t seq, bool last_logits) {
    for (size_t i = 0; i < toks.size(); ++i)
      add(toks[i], pos0 + int32_t(i), seq, last_logits && i + 1 == toks.size());
  }
};

}  // namespace tandem
