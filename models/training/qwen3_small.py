"""A minimal Qwen3 decoder in plain PyTorch, with Hugging Face parameter names.

Used where `transformers` is missing (the CPU smoke test of the recipe on a developer machine) and, on the GPU
machine, to cross-check Hugging Face's Qwen3ForCausalLM on the same weights. Works with PyTorch 1.13 and later.
The maths follows the published Qwen3 architecture: RMSNorm before attention and MLP, per-head RMSNorm of Q and
K before rotary embedding (NEOX layout: rotate the two halves of each head), grouped-query attention, SwiGLU MLP,
tied input/output embeddings.
"""

import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


def qwen3_config(vocab_size, hidden, layers, heads, kv_heads, head_dim, intermediate, max_positions, bos_id,
                 eos_id, rope_theta=10000.0, rms_eps=1e-6):
    """config.json content for transformers' Qwen3ForCausalLM."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
        "rope_theta": rope_theta,
        "rms_norm_eps": rms_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            o = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3Small(nn.Module):
    """Qwen3ForCausalLM-compatible module: state_dict keys are the Hugging Face ones (lm_head tied)."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight
        d = c["head_dim"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.model.embed_tokens(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def save_safetensors(state, path, dtype=torch.bfloat16):
    """Writes a safetensors file (header: 8-byte little-endian length, JSON, then raw little-endian data)."""
    names = sorted(state)
    header, blobs, offset = {}, [], 0
    for name in names:
        t = state[name].detach().to("cpu", dtype).contiguous()
        if dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
            tag = "BF16"
        else:
            raw = t.float().numpy().tobytes()
            tag = "F32"
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)


def export_state(model):
    """Hugging Face checkpoint tensors: everything but the tied lm_head."""
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
