#!/usr/bin/env python3
"""Our files in llama.cpp (issue 16's interop, on the CPU): the CI fixtures tests/data/models/<name>.gguf, written by
`tandem convert` from random transformers checkpoints, run through a built llama.cpp; their logits and greedy
tokens are compared with transformers' own numbers in <name>.json (the same numbers tandem's CI test checks).

The fixtures carry no tokenizer (their prompts are token ids), and llama.cpp needs a `tokenizer.ggml.model` key,
so each file is copied with `tokenizer.ggml.model = "none"` and `<arch>.vocab_size` added (llama.cpp's id-only
vocabulary); nothing else changes, the tensors are copied byte for byte.

Checks per fixture (PASS/FAIL lines, exit 0 only when all pass):
  * logits of every row: max |llama.cpp - hf| / max |hf| per row <= TOL (1e-3: llama.cpp runs f32 weights and an
    f32 K/V cache, flash attention off, but its CPU matmuls may convert activations);
  * the greedy continuation equals transformers' greedy tokens.

Usage: LLAMA_CPP_SRC=<llama.cpp tree> LLAMA_CPP_BIN=<its build/bin with libllama.so> \
       python3 tests/reference/llamacpp_runs_fixtures.py [--out DIR] [NAMES...]
It compiles tests/reference/llamacpp_logits_dump.cpp against that llama.cpp (the probe is ours; llama.cpp itself
must already be built: nothing here builds it)."""

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "models"
TOL = 1e-3

# GGUF value types (the container's numbering).
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def enc_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def rewrite_gguf(src, dst, set_strings=None, add_id_only_vocab=False):
    """Copies the GGUF src to dst with string keys set (added or replaced) and, with add_id_only_vocab, the keys of
    llama.cpp's id-only vocabulary when the file names no tokenizer. Tensor infos and data are copied byte for
    byte. Returns (arch, n_vocab)."""
    data = src.read_bytes()
    r = Reader(data)
    assert data[:4] == b"GGUF", f"{src}: not a GGUF file"
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kvs, meta = [], {}  # kvs: (key, encoded key + type + value), in file order
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        meta[key] = r.value(r.take("I"))
        kvs.append((key, data[start:r.pos]))
    infos_start = r.pos
    tensors = {}
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        r.take("I"), r.take("Q")  # type, offset
        tensors[name] = dims
    infos_end = r.pos
    align = meta.get("general.alignment", 32)
    data_start = (infos_end + align - 1) // align * align
    arch = meta["general.architecture"]
    n_vocab = tensors["token_embd.weight"][1]

    sets = dict(set_strings or {})
    if add_id_only_vocab and "tokenizer.ggml.model" not in meta:
        sets["tokenizer.ggml.model"] = "none"
    encoded = {k: enc_string(k) + struct.pack("<I", STRING) + enc_string(v) for k, v in sets.items()}
    out = [encoded.pop(k, raw) for k, raw in kvs]
    out += encoded.values()
    if add_id_only_vocab and "tokenizer.ggml.model" not in meta and f"{arch}.vocab_size" not in meta:
        out.append(enc_string(f"{arch}.vocab_size") + struct.pack("<I", 4) + struct.pack("<I", n_vocab))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(out)) + b"".join(out)
    head += data[infos_start:infos_end]
    head += b"\0" * ((-len(head)) % align)
    dst.write_bytes(head + data[data_start:])
    return arch, n_vocab


def build_probe(src, lbin, out_dir):
    """Compiles llamacpp_logits_dump.cpp against a built llama.cpp (headers of src, libllama of lbin)."""
    probe = Path(out_dir) / "llamacpp_logits_dump"
    subprocess.run(["g++", "-std=c++17", "-O2", str(Path(__file__).with_name("llamacpp_logits_dump.cpp")),
                    f"-I{src}/include", f"-I{src}/ggml/include", f"-L{lbin}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lbin}", "-o", str(probe)], check=True)
    return probe


def row_rel_error(got, want):
    scale = max(abs(x) for x in want) or 1.0
    return max(abs(a - b) for a, b in zip(got, want)) / scale


def dump(probe, gguf, n_greedy, ids, lbin=None):
    """The probe's JSON: {"n_vocab", "logits": one row per prompt id, "greedy": n_greedy ids}."""
    lib = lbin or os.environ["LLAMA_CPP_BIN"]
    p = subprocess.run([str(probe), str(gguf), str(n_greedy)] + [str(i) for i in ids], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, LD_LIBRARY_PATH=lib))
    if p.returncode != 0:
        raise RuntimeError(f"llama.cpp probe rc {p.returncode}: {p.stderr.strip()[-1500:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["qwen3_tiny", "llama_tiny", "gemma4_tiny", "gemma4_moe_tiny"])
    ap.add_argument("--out", default="/tmp/llamacpp_fixtures")
    args = ap.parse_args()
    src, lbin = os.environ.get("LLAMA_CPP_SRC"), os.environ.get("LLAMA_CPP_BIN")
    if not src or not lbin or not (Path(lbin) / "libllama.so").exists():
        sys.exit("set LLAMA_CPP_SRC (llama.cpp sources) and LLAMA_CPP_BIN (its build/bin with libllama.so)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = build_probe(src, lbin, out)

    failures = 0
    for name in args.names:
        fx = json.loads((FIXTURES / f"{name}.json").read_text())
        gguf = out / f"{name}.gguf"
        arch, n_vocab = rewrite_gguf(FIXTURES / f"{name}.gguf", gguf, add_id_only_vocab=True)
        # Rows: `tokens` where the fixture has them (prompt + first greedy tokens), else the prompt.
        rows = fx.get("tokens", fx["prompt"])
        try:
            got = dump(probe, gguf, 1, rows)
            worst = max(row_rel_error(g, w) for g, w in zip(got["logits"], fx["logits"]))
            ok_rows = len(got["logits"]) == len(fx["logits"]) and worst <= TOL
            greedy = dump(probe, gguf, len(fx["greedy"]), fx["prompt"])["greedy"]
            ok_greedy = greedy == fx["greedy"]
        except Exception as e:  # noqa: BLE001 -- reported as a failure of this fixture
            print(f"FAIL {name} ({arch}): {e}")
            failures += 1
            continue
        print(f"{'PASS' if ok_rows else 'FAIL'} {name} ({arch}, vocab {n_vocab}): {len(fx['logits'])} rows, "
              f"max row relative error {worst:.2e} (tol {TOL:g})")
        print(f"{'PASS' if ok_greedy else 'FAIL'} {name}: {len(greedy)} greedy tokens "
              f"{'equal' if ok_greedy else 'differ from'} transformers'"
              + ("" if ok_greedy else f" (llama.cpp {greedy}, hf {fx['greedy']})"))
        failures += (not ok_rows) + (not ok_greedy)
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failed check(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
