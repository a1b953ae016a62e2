#include "convert/tensor_plan.h"

#include <algorithm>

namespace tandem::convert {

std::vector<PlannedTensor> plan_tensors(const ModelHparams& hp) {
  std::vector<PlannedTensor> out;
  const bool llama = hp.arch == "llama";
  const int64_t q_width = hp.n_head * hp.head_dim;
  const int64_t kv_width = hp.n_head_kv * hp.head_dim;
  auto add = [&](std::string gguf, std::string hf, std::vector<int64_t> ne, int64_t permute = 0,
                 int layer = -1) {
    out.push_back({std::move(gguf), std::move(hf), std::move(ne), permute, layer, false, 0});
  };

  if (hp.rope_scaling.type == "llama3") add("rope_freqs.weight", "", {hp.n_rot() / 2});
  add("token_embd.weight", "model.embed_tokens.weight", {hp.n_embd, hp.n_vocab});

  for (int il = 0; il < int(hp.n_layer); ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const std::string h = "model.layers." + std::to_string(il) + ".";
    add(b + "attn_norm.weight", h + "input_layernorm.weight", {hp.n_embd}, 0, il);
    add(b + "attn_q.weight", h + "self_attn.q_proj.weight", {hp.n_embd, q_width}, llama ? hp.n_head : 0, il);
    add(b + "attn_k.weight", h + "self_attn.k_proj.weight", {hp.n_embd, kv_width}, llama ? hp.n_head_kv : 0,
        il);
    add(b + "attn_v.weight", h + "self_attn.v_proj.weight", {hp.n_embd, kv_width}, 0, il);
    add(b + "attn_output.weight", h + "self_attn.o_proj.weight", {q_width, hp.n_embd}, 0, il);
    if (hp.attention_bias) {
      add(b + "attn_q.bias", h + "self_attn.q_proj.bias", {q_width}, llama ? hp.n_head : 0, il);
      add(b + "attn_k.bias", h + "self_attn.k_proj.bias", {kv_width}, llama ? hp.n_head_kv : 0, il);
      add(b + "attn_v.bias", h + "self_attn.v_proj.bias", {kv_width}, 0, il);
      add(b + "attn_output.bias", h + "self_attn.o_proj.bias", {hp.n_embd}, 0, il);
    }
    if (hp.arch == "qwen3") {
      add(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight", {hp.head_dim}, 0, il);
      add(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight", {hp.head_dim}, 0, il);
    }
    add(b + "ffn_norm.weight", h + "post_attention_layernorm.weight", {hp.n_embd}, 0, il);
    add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", {hp.n_embd, hp.n_ff}, 0, il);
    add(b + "ffn_up.weight", h + "mlp.up_proj.weight", {hp.n_embd, hp.n_ff}, 0, il);
    add(b + "ffn_down.weight", h + "mlp.down_proj.weight", {hp.n_ff, hp.n_embd}, 0, il);
    if (hp.mlp_bias) {
      add(b + "ffn_gate.bias", h + "mlp.gate_proj.bias", {hp.n_ff}, 0, il);
      add(b + "ffn_up.bias", h + "mlp.up_proj.bias", {hp.n_ff}, 0, il);
      add(b + "ffn_down.bias", h + "mlp.down_proj.bias", {hp.n_embd}, 0, il);
    }
  }

  add("output_norm.weight", "model.norm.weight", {hp.n_embd});
  if (!hp.tie_word_embeddings) add("output.weight", "lm_head.weight", {hp.n_embd, hp.n_vocab});
  return out;
}

std::vector<int64_t> hf_shape(const PlannedTensor& t) {
  std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
  if (t.hf_rows > 0) shape[0] = t.hf_rows;
  return shape;
}

int64_t llama_permuted_source_row(int64_t row, int64_t n_rows, int64_t n_heads) {
  const int64_t d = n_rows / n_heads;
  const int64_t head = row / d, within = row % d;
  return head * d + (within % 2 == 0 ? within / 2 : d / 2 + within / 2);
}

}  // namespace tandem::convert
