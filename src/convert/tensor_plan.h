// Which GGUF tensors a converted checkpoint has, where each comes from in the HF checkpoint, and its shape
// (../shared/GGUF-ARCH-FACTS.md B.2, B.5, B.6). An HF weight [out, in] becomes ne {in, out} with the same
// bytes; llama's q_proj / k_proj rows are permuted (rotate-half -> interleaved pairs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "convert/hf_config.h"

namespace tandem::convert {

struct PlannedTensor {
  std::string gguf_name;      // "blk.0.attn_q.weight"
  std::string hf_name;        // "model.layers.0.self_attn.q_proj.weight"; empty for generated tensors
  std::vector<int64_t> ne;    // GGUF order, innermost first
  int64_t permute_heads = 0;  // > 0: apply the llama Q/K row permutation with this many heads
  int layer = -1;             // block index, -1 for tensors outside the blocks
  bool optional = false;      // skipped (not an error) when the checkpoint does not have it
  int64_t hf_rows = 0;        // > 0: the HF tensor has this many outer rows; the first ne.back() are kept
};

// Every tensor the GGUF gets, in the order it is written: rope_freqs (llama3 scaling only), token_embd, the
// blocks, output_norm, output (absent when the embeddings are tied).
std::vector<PlannedTensor> plan_tensors(const ModelHparams& hp);

// Expected HF shape (outermost first) of a planned tensor: ne reversed.
// ne reversed, with hf_rows as the outermost dim when the tensor is trimmed.
std::vector<int64_t> hf_shape(const PlannedTensor& t);

// Source row of GGUF row `row` under the llama Q/K permutation of a matrix with n_rows rows in n_heads heads:
// within each head of d rows, GGUF row 2r comes from HF row r and GGUF row 2r+1 from HF row d/2 + r.
int64_t llama_permuted_source_row(int64_t row, int64_t n_rows, int64_t n_heads);

}  // namespace tandem::convert
