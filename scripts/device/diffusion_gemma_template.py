#!/usr/bin/env python3
"""Writes a DiffusionGemma 26B-A4B-shaped GGUF template for `tandem bench --random-weights` (no torch, seconds).

The gemma4 26B-A4B MoE backbone (GGUF-ARCH-FACTS C.1/C.2/C.5: n_embd 2816, 16 query heads, sliding layers 8 KV
heads x 256, global layers (every 6th, and the last) 2 KV heads x 512 without attn_v, dense MLP n_ff 2112, 128
experts of n_ff 704 fused gate_up, top 8, vocab 262144, window 1024) as architecture `diffusion-gemma` (D.1/D.2):
`diffusion.canvas_length`, non-causal attention, a mask token, per-layer decoder and encoder output scalars and
the self-conditioning MLP (self_cond_pre_norm {n_embd}, gate/up {n_embd, 2112}, down {2112, n_embd}).
--layers of the 30 layers (default 6). Matrices are Q4_0 zeros left as holes of a sparse file: `tandem bench
--random-weights TYPE` replaces each with random values of TYPE. Norms and scalars are f32 ones; the routers are
random f32 so that rows pick varied experts.
usage: diffusion_gemma_template.py OUT.gguf [--layers N] [--canvas C]
"""
import argparse
import random
import struct

T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_Q4_0 = 0, 2


def gguf_str(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def scalar(kind, v):
    return {T_U32: lambda: struct.pack("<I", v), T_I32: lambda: struct.pack("<i", v),
            T_F32: lambda: struct.pack("<f", v), T_BOOL: lambda: struct.pack("<B", 1 if v else 0),
            T_STR: lambda: gguf_str(v)}[kind]()


def keys(L, C, V, sliding, shape):
    E, H, hd, hd_g, kv, kv_g, ff, n_exp, k_exp, ff_exp, window = shape
    a = "diffusion-gemma."
    mask = V - 1
    return [
        ("general.architecture", T_STR, "diffusion-gemma"),
        ("general.name", T_STR, f"DiffusionGemma 26B-A4B shape, {L} layers"),
        (a + "context_length", T_U32, 131072), (a + "embedding_length", T_U32, E), (a + "block_count", T_U32, L),
        (a + "feed_forward_length", T_U32, ff), (a + "attention.head_count", T_U32, H),
        (a + "attention.head_count_kv", (T_ARR, T_I32), [kv if x else kv_g for x in sliding]),
        (a + "attention.key_length", T_U32, hd_g), (a + "attention.value_length", T_U32, hd_g),
        (a + "attention.key_length_swa", T_U32, hd), (a + "attention.value_length_swa", T_U32, hd),
        (a + "rope.dimension_count", T_U32, hd_g), (a + "rope.dimension_count_swa", T_U32, hd),
        (a + "rope.freq_base", T_F32, 1000000.0), (a + "rope.freq_base_swa", T_F32, 10000.0),
        (a + "attention.sliding_window", T_U32, window),
        (a + "attention.sliding_window_pattern", (T_ARR, T_BOOL), sliding),
        (a + "attention.layer_norm_rms_epsilon", T_F32, 1e-6), (a + "attention.causal", T_BOOL, False),
        (a + "attention.shared_kv_layers", T_U32, 0), (a + "embedding_length_per_layer_input", T_U32, 0),
        (a + "final_logit_softcapping", T_F32, 30.0),
        (a + "expert_count", T_U32, n_exp), (a + "expert_used_count", T_U32, k_exp),
        (a + "expert_feed_forward_length", T_U32, ff_exp),
        ("diffusion.canvas_length", T_U32, C), ("diffusion.eb_max_steps", T_U32, 48),
        ("tokenizer.ggml.model", T_STR, "llama"),
        ("tokenizer.ggml.tokens", (T_ARR, T_STR),
         ["<unk>", "<eos>", "<bos>"] + [f"<t{i}>" for i in range(3, V - 1)] + ["<|mask|>"]),
        ("tokenizer.ggml.scores", (T_ARR, T_F32), [0.0] * V),
        ("tokenizer.ggml.token_type", (T_ARR, T_I32), [2, 3, 3] + [1] * (V - 4) + [3]),
        ("tokenizer.ggml.bos_token_id", T_U32, 2), ("tokenizer.ggml.eos_token_id", T_U32, 1),
        ("tokenizer.ggml.unknown_token_id", T_U32, 0), ("tokenizer.ggml.mask_token_id", T_U32, mask),
    ]


def tensors(L, V, sliding, shape):
    E, H, hd, hd_g, kv, kv_g, ff, n_exp, k_exp, ff_exp, window = shape
    out = []  # (name, ne, ggml type)

    def mat(name, *ne):
        out.append((name, list(ne), GGML_Q4_0))

    def vec(name, n):
        out.append((name, [n], GGML_F32))

    mat("token_embd.weight", E, V)
    vec("output_norm.weight", E)
    vec("rope_freqs.weight", hd_g // 2)
    vec("self_cond_pre_norm.weight", E)
    mat("self_cond_gate.weight", E, ff)
    mat("self_cond_up.weight", E, ff)
    mat("self_cond_down.weight", ff, E)
    for il in range(L):
        b = f"blk.{il}."
        h, n_kv = (hd, kv) if sliding[il] else (hd_g, kv_g)
        vec(b + "attn_norm.weight", E)
        mat(b + "attn_q.weight", E, H * h)
        mat(b + "attn_k.weight", E, n_kv * h)
        if sliding[il]:
            mat(b + "attn_v.weight", E, n_kv * h)
        mat(b + "attn_output.weight", H * h, E)
        vec(b + "attn_q_norm.weight", h)
        vec(b + "attn_k_norm.weight", h)
        vec(b + "post_attention_norm.weight", E)
        vec(b + "ffn_norm.weight", E)
        mat(b + "ffn_gate.weight", E, ff)
        mat(b + "ffn_up.weight", E, ff)
        mat(b + "ffn_down.weight", ff, E)
        vec(b + "post_ffw_norm.weight", E)
        out.append((b + "ffn_gate_inp.weight", [E, n_exp], GGML_F32))
        vec(b + "ffn_gate_inp.scale", E)
        vec(b + "pre_ffw_norm_2.weight", E)
        vec(b + "post_ffw_norm_1.weight", E)
        vec(b + "post_ffw_norm_2.weight", E)
        mat(b + "ffn_gate_up_exps.weight", E, 2 * ff_exp, n_exp)
        mat(b + "ffn_down_exps.weight", ff_exp, E, n_exp)
        vec(b + "ffn_down_exps.scale", n_exp)
        vec(b + "layer_output_scale.weight", 1)
        vec(b + "enc_layer_output_scale.weight", 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--canvas", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=262144)
    a = ap.parse_args()
    L, V = a.layers, a.vocab
    shape = (2816, 16, 256, 512, 8, 2, 2112, 128, 8, 704, 1024)
    hd_g = shape[3]
    sliding = [(i % 6) != 5 for i in range(L)]
    sliding[-1] = False
    kvs = keys(L, a.canvas, V, sliding, shape)
    ts = tensors(L, V, sliding, shape)

    def nbytes(ne, t):
        n = 1
        for d in ne:
            n *= d
        return n * 4 if t == GGML_F32 else n // 32 * 18

    align = 32
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kvs)))
    for key, kind, v in kvs:
        head += gguf_str(key)
        if isinstance(kind, tuple):
            head += struct.pack("<IIQ", T_ARR, kind[1], len(v)) + b"".join(scalar(kind[1], x) for x in v)
        else:
            head += struct.pack("<I", kind) + scalar(kind, v)
    offsets, off = [], 0
    for name, ne, t in ts:
        offsets.append(off)
        head += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        head += struct.pack("<IQ", t, off)
        off += (nbytes(ne, t) + align - 1) // align * align
    head += b"\0" * ((-len(head)) % align)
    base = len(head)
    rng = random.Random(7)
    with open(a.out, "wb") as f:
        f.write(head)
        for (name, ne, t), o in zip(ts, offsets):
            if t != GGML_F32:
                continue  # Q4_0 zeros: a hole of the sparse file
            f.seek(base + o)
            n = nbytes(ne, t) // 4
            if name.endswith("ffn_gate_inp.weight"):  # kept by --random-weights: varied experts per row
                f.write(struct.pack(f"<{n}f", *[rng.uniform(-1, 1) for _ in range(n)]))
            elif name == "rope_freqs.weight":
                one = hd_g // 8  # partial_rotary_factor 0.25
                f.write(struct.pack(f"<{n}f", *([1.0] * one + [1e30] * (n - one))))
            else:
                f.write(struct.pack(f"<{n}f", *([1.0] * n)))
        f.truncate(base + off)
    print(f"wrote {a.out}: diffusion-gemma, {L} layers, canvas {a.canvas}, {len(ts)} tensors, "
          f"{(base + off) / 2**30:.2f} GiB (sparse)")


if __name__ == "__main__":
    main()
