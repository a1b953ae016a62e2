"""DFlash block-diffusion drafter in plain PyTorch, reimplemented from its published description (z-lab's
DFlashDraftModel; ../../shared/GGUF-ARCH-FACTS.md E.3), plus a GGUF reader/writer for the small files tandem
ships. Used by train_dflash.py (training the shipped drafter) and tests/reference/dflash_parity.py (tandem's
drafter logits against this module on random weights).

The drafter: fused target features f (the residual-stream inputs of chosen target layers, concatenated in
target_layers order) become g = RMSNorm(fc(f) [* fc_scale]) . hidden_norm. Each layer is a Qwen3 layer whose
attention keys/values are [K/V of the context rows, computed from g without the input norm] followed by [K/V of
the block rows]; queries come from the block only; no causal mask inside the block; per-head RMSNorm of q and k
before NEOX rotary embedding. Logits come from the target's head (norm, then lm_head). Noise embeddings are the
target's token embeddings of [last token, mask, mask, ...], not scaled.
"""

import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


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


def rope_cos_sin(pos, head_dim, theta, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=pos.device) / head_dim))
    f = pos.double()[..., None] * inv
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class DFlashLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.heads, self.kv_heads, self.hd = c["hidden_size"], c["heads"], c["kv_heads"], c["head_dim"]
        eps = c["rms_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.q_proj = nn.Linear(h, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(self.heads * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, eps)
        self.k_norm = RMSNorm(self.hd, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        f = c["ffn"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x, g, q_cs, ctx_cs, blk_cs, mask):
        """x [B, Tq, h] block rows; g [B, Tc, h] context rows; *_cs (cos, sin) per row; mask [B, 1, Tq, Tc+Tq]
        boolean (True = visible)."""
        b, tq, _ = x.shape
        tc = g.shape[1]
        hn = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(hn).view(b, tq, self.heads, self.hd))
        kb = self.k_norm(self.k_proj(hn).view(b, tq, self.kv_heads, self.hd))
        kc = self.k_norm(self.k_proj(g).view(b, tc, self.kv_heads, self.hd))
        vb = self.v_proj(hn).view(b, tq, self.kv_heads, self.hd)
        vc = self.v_proj(g).view(b, tc, self.kv_heads, self.hd)
        q = q * q_cs[0][:, :, None] + rotate_half(q) * q_cs[1][:, :, None]
        kc = kc * ctx_cs[0][:, :, None] + rotate_half(kc) * ctx_cs[1][:, :, None]
        kb = kb * blk_cs[0][:, :, None] + rotate_half(kb) * blk_cs[1][:, :, None]
        k = torch.cat([kc, kb], 1).transpose(1, 2)
        v = torch.cat([vc, vb], 1).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        q = q.transpose(1, 2).to(v.dtype)  # the norms return f32 under autocast; v is the matmul's dtype
        k = k.to(v.dtype)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # PyTorch 1.x
            s = (q @ k.transpose(-1, -2)) / (self.hd ** 0.5)
            o = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, tq, self.heads * self.hd))
        h2 = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h2)) * self.up_proj(h2))


class DFlashDraft(nn.Module):
    """c: hidden_size, layers, heads, kv_heads, head_dim, ffn, rms_eps, rope_theta, n_taps."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        self.fc = nn.Linear(c["n_taps"] * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, c["rms_eps"])
        self.layers = nn.ModuleList([DFlashLayer(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(h, c["rms_eps"])
        self.fc_scale = None  # optional scalar

    def forward(self, noise_emb, feats, q_pos, ctx_pos, mask):
        """noise_emb [B, Tq, h]: target embeddings of the block tokens; feats [B, Tc, n_taps*h]; q_pos [B, Tq],
        ctx_pos [B, Tc] positions; mask [B, 1, Tq, Tc+Tq] (True = visible). Returns the normed hidden rows."""
        u = self.fc(feats)
        if self.fc_scale is not None:
            u = u * self.fc_scale
        g = self.hidden_norm(u)
        dt = noise_emb.dtype
        hd, th = self.c["head_dim"], self.c["rope_theta"]
        q_cs = rope_cos_sin(q_pos, hd, th, dt)
        ctx_cs = rope_cos_sin(ctx_pos, hd, th, dt)
        x = noise_emb
        for layer in self.layers:
            x = layer(x, g, q_cs, ctx_cs, q_cs, mask)
        return self.norm(x)


# ---------------------------------------------------------------------------------------------------------
# GGUF: enough of the format (A.1-A.7) to read the small target (F32/F16/Q8_0) and write a drafter.

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_value(f, t):
    if t in _SCALAR:
        fmt = _SCALAR[t]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if t == 8:
        n = struct.unpack("<Q", f.read(8))[0]
        return f.read(n).decode("utf-8")
    if t == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        return [_read_value(f, et) for _ in range(n)]
    raise ValueError("unknown GGUF value type %d" % t)


def read_gguf(path):
    """Returns (metadata dict, {name: float32 numpy array in ggml ne order reversed, i.e. torch layout})."""
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF", path + ": not a GGUF file"
        version, n_t, n_kv = struct.unpack("<IQQ", f.read(20))
        meta = {}
        for _ in range(n_kv):
            n = struct.unpack("<Q", f.read(8))[0]
            key = f.read(n).decode("utf-8")
            t = struct.unpack("<I", f.read(4))[0]
            meta[key] = _read_value(f, t)
        infos = []
        for _ in range(n_t):
            n = struct.unpack("<Q", f.read(8))[0]
            name = f.read(n).decode("utf-8")
            nd = struct.unpack("<I", f.read(4))[0]
            ne = struct.unpack("<%dQ" % nd, f.read(8 * nd))
            typ, off = struct.unpack("<IQ", f.read(12))
            infos.append((name, ne, typ, off))
        align = meta.get("general.alignment", 32)
        base = (f.tell() + align - 1) // align * align
        data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, ne, typ, off in infos:
        n = int(np.prod(ne))
        p = base + off
        if typ == 0:
            a = np.frombuffer(data[p:p + 4 * n], dtype=np.float32).copy()
        elif typ == 1:
            a = np.frombuffer(data[p:p + 2 * n], dtype=np.float16).astype(np.float32)
        elif typ == 8:  # Q8_0: fp16 d, 32 int8
            nb = n // 32
            raw = np.frombuffer(data[p:p + 34 * nb], dtype=np.uint8).reshape(nb, 34)
            d = raw[:, :2].copy().view(np.float16).astype(np.float32)
            q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
            a = (q * d).reshape(-1)
        else:
            raise ValueError("%s: tensor type %d not supported by this reader" % (name, typ))
        tensors[name] = a.reshape(tuple(reversed(ne)))
    return meta, tensors


def _q8_0(a):
    """ggml's Q8_0 of a float32 array (length a multiple of 32): per block d = amax / 127, q = round(x / d)."""
    b = a.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    v = b * inv[:, None]
    q = np.clip(np.trunc(v + np.copysign(0.5, v)), -128, 127).astype(np.int8)  # roundf: half away from zero
    out = np.empty((b.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def write_gguf(path, meta, tensors, q8=True):
    """meta: list of (key, type id, value) (type 9 values: (elem type, list)); tensors: list of (name, numpy
    float32 array in torch layout). 2-D tensors whose rows are a multiple of 32 are stored as Q8_0 when q8."""
    def enc_str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def enc_val(t, v):
        if t in _SCALAR:
            return struct.pack(_SCALAR[t], v)
        if t == 8:
            return enc_str(v)
        if t == 9:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(enc_val(et, x) for x in items)
        raise ValueError(t)

    align = 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        head += enc_str(k) + struct.pack("<I", t) + enc_val(t, v)
    blobs, infos, off = [], b"", 0
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype=np.float32)
        ne = tuple(reversed(a.shape))
        if q8 and a.ndim == 2 and ne[0] % 32 == 0:
            raw, typ = _q8_0(a.reshape(-1)), 8
        else:
            raw, typ = a.tobytes(), 0
        infos += enc_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        infos += struct.pack("<IQ", typ, off)
        pad = (-len(raw)) % align
        blobs.append(raw + b"\0" * pad)
        off += len(raw) + pad
    body = head + infos
    body += b"\0" * ((-len(body)) % align)
    with open(path + ".tmp", "wb") as f:
        f.write(body)
        for b in blobs:
            f.write(b)
    import os
    os.replace(path + ".tmp", path)


def drafter_gguf_meta(c, target_layers, block_size, mask_token_id, n_ctx, name):
    """The dflash.* keys (E.1) for a drafter of config c."""
    a = "dflash."
    return [
        ("general.architecture", 8, "dflash"),
        ("general.name", 8, name),
        (a + "block_count", 4, c["layers"]),
        (a + "context_length", 4, n_ctx),
        (a + "embedding_length", 4, c["hidden_size"]),
        (a + "feed_forward_length", 4, c["ffn"]),
        (a + "attention.head_count", 4, c["heads"]),
        (a + "attention.head_count_kv", 4, c["kv_heads"]),
        (a + "attention.key_length", 4, c["head_dim"]),
        (a + "attention.value_length", 4, c["head_dim"]),
        (a + "rope.freq_base", 6, float(c["rope_theta"])),
        (a + "attention.layer_norm_rms_epsilon", 6, float(c["rms_eps"])),
        (a + "block_size", 4, block_size),
        (a + "target_layers", 9, (5, list(target_layers))),
        ("tokenizer.ggml.mask_token_id", 4, mask_token_id),
    ]


def drafter_gguf_tensors(model):
    """(GGUF name, array) of a DFlashDraft (no token_embd / output: the target's are used)."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    out = [("fc.weight", sd["fc.weight"]), ("enc.output_norm.weight", sd["hidden_norm.weight"]),
           ("output_norm.weight", sd["norm.weight"])]
    names = {"input_layernorm.weight": "attn_norm.weight", "q_proj.weight": "attn_q.weight",
             "k_proj.weight": "attn_k.weight", "v_proj.weight": "attn_v.weight",
             "o_proj.weight": "attn_output.weight", "q_norm.weight": "attn_q_norm.weight",
             "k_norm.weight": "attn_k_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "gate_proj.weight": "ffn_gate.weight", "up_proj.weight": "ffn_up.weight",
             "down_proj.weight": "ffn_down.weight"}
    for i in range(len(model.layers)):
        for hf, gg in names.items():
            out.append(("blk.%d.%s" % (i, gg), sd["layers.%d.%s" % (i, hf)]))
    if model.fc_scale is not None:
        out.append(("fc.scale", np.array([float(model.fc_scale)], dtype=np.float32)))
    return out
