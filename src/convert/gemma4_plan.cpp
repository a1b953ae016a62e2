#include "convert/gemma4_plan.h"

#include "core/error.h"

namespace tandem::convert {

std::vector<PlannedTensor> plan_gemma4_tensors(const Gemma4Hparams& hp, int64_t n_vocab_gguf) {
  check(n_vocab_gguf > 0 && n_vocab_gguf <= hp.n_vocab, "the tokenizer has " + std::to_string(n_vocab_gguf) +
                                                            " tokens, but config.json vocab_size is " +
                                                            std::to_string(hp.n_vocab));
  std::vector<PlannedTensor> out;
  const std::string& m = hp.tensor_prefix;
  auto add = [&](std::string gguf, std::string hf, std::vector<int64_t> ne, int layer = -1,
                 bool optional = false, int64_t hf_rows = 0) {
    out.push_back({std::move(gguf), std::move(hf), std::move(ne), 0, layer, optional, hf_rows});
  };

  add("rope_freqs.weight", "", {hp.global_head_dim / 2});
  add("token_embd.weight", m + "embed_tokens.weight", {hp.n_embd, n_vocab_gguf}, -1, false, hp.n_vocab);
  const int64_t n_pl = hp.n_embd_per_layer;
  if (n_pl > 0) {
    check(hp.n_vocab_per_layer >= n_vocab_gguf,
          "config.json vocab_size_per_layer_input (" + std::to_string(hp.n_vocab_per_layer) +
              ") is below the tokenizer's token count (" + std::to_string(n_vocab_gguf) + ")");
    add("per_layer_token_embd.weight", m + "embed_tokens_per_layer.weight", {n_pl * hp.n_layer, n_vocab_gguf},
        -1, false, hp.n_vocab_per_layer);
    add("per_layer_model_proj.weight", m + "per_layer_model_projection.weight",
        {hp.n_embd, n_pl * hp.n_layer});
    add("per_layer_proj_norm.weight", m + "per_layer_projection_norm.weight", {n_pl});
  }

  for (int il = 0; il < int(hp.n_layer); ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const std::string h = m + "layers." + std::to_string(il) + ".";
    const int64_t hd = hp.head_dim_of(il), q = hp.n_head * hd, kv = hp.n_head_kv_of(il) * hd;
    const int64_t ff = hp.n_ff_of(il);
    // KV-sharing layers reuse another layer's cache (facts C.7); their own k/v projections are kept when the
    // checkpoint has them, as llama.cpp's converter copies whatever tensors map.
    const bool shared = hp.kv_shared(il);
    add(b + "attn_norm.weight", h + "input_layernorm.weight", {hp.n_embd}, il);
    add(b + "attn_q.weight", h + "self_attn.q_proj.weight", {hp.n_embd, q}, il);
    add(b + "attn_k.weight", h + "self_attn.k_proj.weight", {hp.n_embd, kv}, il, shared);
    if (!(hp.k_eq_v && !hp.is_sliding(il)))  // attention_k_eq_v: global layers take V from K
      add(b + "attn_v.weight", h + "self_attn.v_proj.weight", {hp.n_embd, kv}, il, shared);
    add(b + "attn_output.weight", h + "self_attn.o_proj.weight", {q, hp.n_embd}, il);
    add(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight", {hd}, il);
    add(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight", {hd}, il, shared);
    add(b + "post_attention_norm.weight", h + "post_attention_layernorm.weight", {hp.n_embd}, il);
    add(b + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight", {hp.n_embd}, il);
    add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", {hp.n_embd, ff}, il);
    add(b + "ffn_up.weight", h + "mlp.up_proj.weight", {hp.n_embd, ff}, il);
    add(b + "ffn_down.weight", h + "mlp.down_proj.weight", {ff, hp.n_embd}, il);
    add(b + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight", {hp.n_embd}, il);
    add(b + "layer_output_scale.weight", h + "layer_scalar", {1}, il, true);
    if (hp.n_expert > 0) {
      const int64_t ne = hp.n_expert, fe = hp.n_ff_exp;
      add(b + "ffn_gate_inp.weight", h + "router.proj.weight", {hp.n_embd, ne}, il);
      add(b + "ffn_gate_inp.scale", h + "router.scale", {hp.n_embd}, il);
      add(b + "pre_ffw_norm_2.weight", h + "pre_feedforward_layernorm_2.weight", {hp.n_embd}, il);
      add(b + "post_ffw_norm_1.weight", h + "post_feedforward_layernorm_1.weight", {hp.n_embd}, il);
      add(b + "post_ffw_norm_2.weight", h + "post_feedforward_layernorm_2.weight", {hp.n_embd}, il);
      add(b + "ffn_gate_up_exps.weight", h + "experts.gate_up_proj", {hp.n_embd, 2 * fe, ne}, il);
      add(b + "ffn_down_exps.weight", h + "experts.down_proj", {fe, hp.n_embd, ne}, il);
      add(b + "ffn_down_exps.scale", h + "router.per_expert_scale", {ne}, il);
    }
    if (n_pl > 0) {
      add(b + "inp_gate.weight", h + "per_layer_input_gate.weight", {hp.n_embd, n_pl}, il);
      add(b + "proj.weight", h + "per_layer_projection.weight", {n_pl, hp.n_embd}, il);
      add(b + "post_norm.weight", h + "post_per_layer_input_norm.weight", {hp.n_embd}, il);
    }
  }

  add("output_norm.weight", m + "norm.weight", {hp.n_embd});
  if (!hp.tie_word_embeddings)
    add("output.weight", "lm_head.weight", {hp.n_embd, n_vocab_gguf}, -1, false, hp.n_vocab);
  return out;
}

}  // namespace tandem::convert
