#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json (+ tokenizer_config.json) for the byte-level BPE vocabulary stored in a
tandem GGUF (the shipped small models), optionally with extra special tokens appended (the diffusion model's
<|mask|>). Python standard library only: it reads the GGUF metadata itself.

  python3 models/training/gguf_tokenizer_to_hf.py models/tandem-small-q8_0.gguf OUT_DIR [--add-special <|mask|>]

The result tokenizes exactly as the GGUF does (same regex, NFC, same merges); train_diffusion.py uses it so
that the canvas model shares the small models' vocabulary, and `tandem convert` turns it back into GGUF keys.
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path):
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the metadata sits at the front; 64 MiB covers any vocabulary
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t in SCALARS:
            return take(SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError("unknown GGUF value type %d" % t)

    if data[:4] != b"GGUF":
        raise SystemExit(path + ": not a GGUF file")
    pos = 4
    take("<I")
    take("<Q")
    n_kv = take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    return kv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--add-special", action="append", default=[])
    args = ap.parse_args()
    kv = read_gguf_metadata(args.gguf)
    if kv.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit("only byte-level BPE (tokenizer.ggml.model = gpt2) vocabularies are exported")
    from hf_tokenizer_layout import tokenizer_json
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = kv.get("tokenizer.ggml.merges", [])
    vocab = {t: i for i, t in enumerate(tokens)}
    specials = [i for i, ty in enumerate(types) if ty == 3]  # CONTROL
    for s in args.add_special:
        vocab[s] = len(vocab)
        specials.append(vocab[s])
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges, specials), f, ensure_ascii=False, indent=1)
    eot = tokens[kv.get("tokenizer.ggml.bos_token_id", 0)]
    cfg = {"add_bos_token": bool(kv.get("tokenizer.ggml.add_bos_token", True)), "add_eos_token": False,
           "bos_token": eot, "eos_token": eot, "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}
    if args.add_special:
        cfg["mask_token"] = args.add_special[0]
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("wrote %s: %d tokens (%d merges), specials %s" % (path, len(vocab), len(merges), specials))


if __name__ == "__main__":
    main()
