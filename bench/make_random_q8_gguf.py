#!/usr/bin/env python3
"""Writes a random-weight Q8_0 GGUF of a model shape straight from the shape: no checkpoint, no conversion, no
numpy or torch (struct and os.urandom only), so an 8B-shape file takes seconds (disk speed) where
bench/models.sh's transformers checkpoint + convert takes minutes. For speed benches only: the values are
random Q8_0 codes with small fp16 scales (|w| < 0.013, so 36 random layers stay finite), norms are ones, and
there is no tokenizer (tandem then takes the vocabulary size from token_embd; benches feed token ids).

Shapes:
  qwen3-8b         the Qwen3-8B target (36 layers, 4096 wide, GQA 32/8 of 128, SwiGLU 12288, vocab 151936,
                   untied head, rope base 1e6)
  qwen3-8b-dflash  a DFlash drafter for it in the shape of published DFlash drafters (GGUF-ARCH-FACTS E.1):
                   5 Qwen3 layers of the target's width, taps of HF layers 1, 9, 17, 25, 33 (dflash.target_layers
                   2, 10, 18, 26, 34), block 16, mask token 151669, no token_embd / output (the target's)
  tiny, tiny-dflash  the same layouts at a width of 64 (checks the writer on a CPU)

usage: python3 bench/make_random_q8_gguf.py SHAPE OUT.gguf [--seed N]
"""

import argparse
import os
import random
import struct
import sys

SHAPES = {
    "qwen3-8b": dict(arch="qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                     vocab=151936, ctx=40960, rope=1000000.0, tied=False),
    "qwen3-8b-dflash": dict(arch="dflash", hidden=4096, layers=5, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                            vocab=0, ctx=40960, rope=1000000.0, target_layers=[2, 10, 18, 26, 34], block=16,
                            mask=151669),
    "tiny": dict(arch="qwen3", hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256,
                 ctx=512, rope=10000.0, tied=False),
    "tiny-dflash": dict(arch="dflash", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=0,
                        ctx=512, rope=10000.0, target_layers=[1, 3], block=8, mask=255),
}

F32, Q8_0 = 0, 8
T_U32, T_F32, T_STR, T_ARR, T_I32 = 4, 6, 8, 9, 5


def tensors(s):
    """(name, ne (ggml order: ne[0] = row length), type) of the shape."""
    E, hd, L = s["hidden"], s["head_dim"], s["layers"]
    out = []
    if s["arch"] == "qwen3":
        out.append(("token_embd.weight", (E, s["vocab"]), Q8_0))
        if not s["tied"]:
            out.append(("output.weight", (E, s["vocab"]), Q8_0))
    else:
        out.append(("fc.weight", (len(s["target_layers"]) * E, E), Q8_0))
        out.append(("enc.output_norm.weight", (E,), F32))
    out.append(("output_norm.weight", (E,), F32))
    for i in range(L):
        b = "blk.%d." % i
        out += [(b + "attn_norm.weight", (E,), F32), (b + "attn_q.weight", (E, s["heads"] * hd), Q8_0),
                (b + "attn_k.weight", (E, s["kv_heads"] * hd), Q8_0),
                (b + "attn_v.weight", (E, s["kv_heads"] * hd), Q8_0),
                (b + "attn_output.weight", (s["heads"] * hd, E), Q8_0),
                (b + "attn_q_norm.weight", (hd,), F32), (b + "attn_k_norm.weight", (hd,), F32),
                (b + "ffn_norm.weight", (E,), F32), (b + "ffn_gate.weight", (E, s["ffn"]), Q8_0),
                (b + "ffn_up.weight", (E, s["ffn"]), Q8_0), (b + "ffn_down.weight", (s["ffn"], E), Q8_0)]
    return out


def metadata(s, name):
    a = s["arch"] + "."
    kv = [("general.architecture", T_STR, s["arch"]), ("general.name", T_STR, name),
          ("general.file_type", T_U32, 7),
          (a + "block_count", T_U32, s["layers"]), (a + "context_length", T_U32, s["ctx"]),
          (a + "embedding_length", T_U32, s["hidden"]), (a + "feed_forward_length", T_U32, s["ffn"]),
          (a + "attention.head_count", T_U32, s["heads"]), (a + "attention.head_count_kv", T_U32, s["kv_heads"]),
          (a + "attention.key_length", T_U32, s["head_dim"]), (a + "attention.value_length", T_U32, s["head_dim"]),
          (a + "rope.freq_base", T_F32, s["rope"]), (a + "attention.layer_norm_rms_epsilon", T_F32, 1e-6)]
    if s["arch"] == "dflash":
        kv += [(a + "block_size", T_U32, s["block"]), (a + "target_layers", T_ARR, (T_I32, s["target_layers"])),
               ("tokenizer.ggml.mask_token_id", T_U32, s["mask"])]
    return kv


def enc_str(x):
    b = x.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_val(t, v):
    if t == T_U32:
        return struct.pack("<I", v)
    if t == T_I32:
        return struct.pack("<i", v)
    if t == T_F32:
        return struct.pack("<f", v)
    if t == T_STR:
        return enc_str(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(enc_val(et, x) for x in items)


def nbytes(ne, typ):
    n = 1
    for d in ne:
        n *= d
    return n * 4 if typ == F32 else n // 32 * 34


def q8_pool(n_blocks, rng):
    """n_blocks random Q8_0 blocks: fp16 scale in [5e-5, 1e-4) (|w| <= 127 * 1e-4), 32 random int8 codes."""
    codes = os.urandom(32 * n_blocks)
    out = bytearray(34 * n_blocks)
    for i in range(n_blocks):
        out[34 * i:34 * i + 2] = struct.pack("<e", 5e-5 + 5e-5 * rng.random())
        out[34 * i + 2:34 * i + 34] = codes[32 * i:32 * i + 32]
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    rng = random.Random(args.seed)
    ts = tensors(s)
    kv = metadata(s, args.shape + "-random")
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kv))
    for k, t, v in kv:
        head += enc_str(k) + struct.pack("<I", t) + enc_val(t, v)
    align, off, infos = 32, 0, b""
    for name, ne, typ in ts:
        infos += enc_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        infos += struct.pack("<IQ", typ, off)
        off += (nbytes(ne, typ) + align - 1) // align * align
    body = head + infos
    body += b"\0" * ((-len(body)) % align)
    # One pool of random blocks, written round-robin from a random start per tensor: the values only have to
    # be ordinary numbers (speed does not depend on them), and this keeps the writer at disk speed.
    pool = q8_pool(1 << 16, rng)
    with open(args.out + ".tmp", "wb") as f:
        f.write(body)
        for name, ne, typ in ts:
            n = nbytes(ne, typ)
            if typ == F32:
                f.write(struct.pack("<f", 1.0) * (n // 4))
            else:
                pos = 34 * rng.randrange(1 << 16)
                left = n
                while left > 0:
                    chunk = pool[pos:pos + left]
                    f.write(chunk)
                    left -= len(chunk)
                    pos = 0
            f.write(b"\0" * ((-n) % align))
    os.replace(args.out + ".tmp", args.out)
    print("wrote %s: %s, %d tensors, %.2f GB" % (args.out, args.shape, len(ts), os.path.getsize(args.out) / 1e9))


if __name__ == "__main__":
    sys.exit(main())
