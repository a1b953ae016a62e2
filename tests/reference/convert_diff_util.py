"""What the converter comparisons share (gemma4_convert_diff.py, dflash_convert_diff.py): running llama.cpp's
convert_hf_to_gguf.py where transformers is absent, a safetensors writer, the GGUF diff, tandem's logits dump.

llama.cpp's converter runs under the Python given (its torch and numpy). Where that Python has no
`transformers` (the development machine: Debian's torch 1.13), a stand-in package goes on its path: AutoConfig
raises, which sends the converter down its own fallback of reading config.json (every hyperparameter it writes
comes from its own code reading the file), and AutoTokenizer reads tokenizer.json and answers the questions
gguf.LlamaHfVocab asks (vocabulary, added vocabulary, special tokens). The stand-in only feeds tokenizer.* keys,
which the diff reports and does not count. torch < 2.1 lacks the float8 dtypes the converter names in a table:
placeholders are set for those names (no F8 tensor is converted)."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

# The stand-in `transformers` for llama.cpp's converter where the real one is absent (see the docstring).
STAND_IN = '''"""Stand-in for transformers (tests/reference/convert_diff_util.py): no real transformers here."""
import json, os


class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise RuntimeError("stand-in transformers: read config.json")


class _Tokenizer:
    is_fast = True

    def __init__(self, d):
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
            tc = json.load(f)
        self.vocab = dict(tj["model"]["vocab"])
        self._added = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.vocab_size = len(self.vocab)
        self.all_special_tokens = [tc[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in tc]

    def get_vocab(self):
        return {**self.vocab, **self._added}

    def get_added_vocab(self):
        return dict(self._added)

    @property
    def all_special_ids(self):
        v = self.get_vocab()
        return [v[t] for t in self.all_special_tokens]


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, *args, **kwargs):
        return _Tokenizer(str(path))
'''

# Runs llama.cpp's converter with placeholders for the float8 dtype names torch < 2.1 lacks.
RUNNER = '''import runpy, sys, torch
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def write_safetensors(path, tensors):
    """safetensors: u64 header length, the JSON header (names, F32, shapes, byte offsets), the raw data."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def gguf_diff(ref_path, got_path, arch, out=sys.stdout, rows_may_differ=()):
    """Every <arch>.* key (arch: one prefix or a tuple of them) and every tensor of two GGUF files; returns the number of mismatches. tokenizer.*
    differences are printed as INFO lines, not counted. Tensors named in rows_may_differ may have different
    row counts (INFO); their common rows must be equal."""
    from gguf import GGUFReader
    ref, got = GGUFReader(ref_path), GGUFReader(got_path)

    def kv(r, prefix):
        res = {}
        for k, f in r.fields.items():
            if not k.startswith(prefix):
                continue
            v = f.contents() if hasattr(f, "contents") else [f.parts[i].tolist() for i in f.data]
            res[k] = (f.types[0].name if f.types else "?", v)
        return res

    bad = 0
    prefixes = tuple(p + "." for p in ((arch,) if isinstance(arch, str) else arch))
    a, b = kv(ref, prefixes), kv(got, prefixes)
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            bad += 1
            print("KEY", k, "llama.cpp:", a.get(k), "tandem:", b.get(k), file=out)
    ka, kb = kv(ref, "tokenizer."), kv(got, "tokenizer.")
    for k in sorted(set(ka) | set(kb)):
        if ka.get(k) != kb.get(k):
            print("INFO tokenizer key differs:", k, "llama.cpp:", str(ka.get(k))[:160], "tandem:",
                  str(kb.get(k))[:160], file=out)
    ta, tb = {t.name: t for t in ref.tensors}, {t.name: t for t in got.tensors}
    for n in sorted(set(ta) | set(tb)):
        if n not in ta or n not in tb:
            bad += 1
            print("TENSOR only in", "tandem" if n in tb else "llama.cpp", n, file=out)
            continue
        x, y = ta[n], tb[n]
        if n in rows_may_differ and list(x.shape[:-1]) == list(y.shape[:-1]) and x.tensor_type == y.tensor_type:
            r = min(int(x.shape[-1]), int(y.shape[-1]))
            xs, ys = np.asarray(x.data).reshape(-1)[:r * int(x.shape[0])], np.asarray(y.data).reshape(-1)[
                :r * int(y.shape[0])]
            print("INFO", n, "rows: llama.cpp", int(x.shape[-1]), "tandem", int(y.shape[-1]), file=out)
            if not np.array_equal(xs, ys):
                bad += 1
                print("TENSOR", n, "the common rows differ", file=out)
            continue
        if list(x.shape) != list(y.shape) or x.tensor_type != y.tensor_type:
            bad += 1
            print("TENSOR", n, "shape/type", list(x.shape), x.tensor_type.name, "vs", list(y.shape),
                  y.tensor_type.name, file=out)
            continue
        if not np.array_equal(np.asarray(x.data), np.asarray(y.data)):
            bad += 1
            d = np.max(np.abs(np.asarray(x.data, np.float64) - np.asarray(y.data, np.float64)))
            print("TENSOR", n, "values differ, max abs diff", float(d), file=out)
    print("keys compared:", len(set(a) | set(b)), "tensors compared:", len(set(ta) | set(tb)),
          "mismatches:", bad, file=out)
    return bad


def read_tandem_logits(blob):
    """`tandem generate --dump-logits`: "TLOG", u32 n_vocab, then per row i32 sequence, i32 position, floats."""
    assert blob[:4] == b"TLOG"
    n_vocab = struct.unpack_from("<I", blob, 4)[0]
    row = 8 + 4 * n_vocab
    return [np.frombuffer(blob, "<f4", n_vocab, 8 + i * row + 8).astype(np.float64)
            for i in range((len(blob) - 8) // row)]


def run_llamacpp_converter(python, llama_src, hf_dir, outfile, work, log, extra=()):
    """llama.cpp's convert_hf_to_gguf.py HF_DIR --outtype f32 --outfile OUTFILE [extra]; None or an error line."""
    work = Path(work)
    paths = [str(Path(llama_src)), str(Path(llama_src) / "gguf-py")]
    if subprocess.run([python, "-c", "import transformers"], capture_output=True).returncode != 0:
        stand_in = work / "stand_in"
        stand_in.mkdir(parents=True, exist_ok=True)
        (stand_in / "transformers.py").write_text(STAND_IN)
        paths.append(str(stand_in))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))
    runner = work / "run_converter.py"
    runner.write_text(RUNNER)
    r = subprocess.run([python, str(runner), str(Path(llama_src) / "convert_hf_to_gguf.py"), str(hf_dir),
                        "--outtype", "f32", "--outfile", str(outfile), *extra], env=env, capture_output=True,
                       text=True, timeout=300)
    Path(log).write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        return f"llama.cpp's converter exited {r.returncode}: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return None


def run_tandem(tandem, args, log=None):
    """`tandem ARGS`; (returncode, stdout bytes, stderr text). stdout stays bytes: a random model's text need
    not be UTF-8."""
    r = subprocess.run([str(tandem), *map(str, args)], capture_output=True, timeout=300)
    err = r.stderr.decode(errors="replace")
    if log:
        Path(log).write_text(r.stdout.decode(errors="replace") + err)
    return r.returncode, r.stdout, err


def last_line(text):
    return (text.strip().splitlines() or ["?"])[-1]


def compare_files(variant, ref, got, prefixes, diff_path, mask_id=None, rows_may_differ=(), extra_check=None):
    """gguf_diff of REF (the peer's file) and GOT (tandem's) into diff_path, plus tokenizer.ggml.mask_token_id
    when mask_id is given (a tokenizer key that carries model meaning: both must hold mask_id) and whatever
    extra_check(out) -> mismatches adds. Returns (fail line or None, summary, tokenizer keys that differ)."""
    with open(diff_path, "w") as f:
        bad = gguf_diff(str(ref), str(got), prefixes, out=f, rows_may_differ=rows_may_differ)
        if mask_id is not None:
            from gguf import GGUFReader
            fields = [GGUFReader(str(p)).fields.get("tokenizer.ggml.mask_token_id") for p in (ref, got)]
            vals = [None if m is None else int(m.contents()) for m in fields]
            if vals[0] != vals[1] or vals[1] != mask_id:
                bad += 1
                print("KEY tokenizer.ggml.mask_token_id peer:", vals[0], "tandem:", vals[1], "want", mask_id,
                      file=f)
        if extra_check:
            bad += extra_check(f)
    lines = Path(diff_path).read_text().splitlines()
    summary = [ln for ln in lines if ln.startswith("keys compared")][-1]
    if mask_id is not None:
        summary += " + mask_token_id"
    info = sum(1 for ln in lines if ln.startswith("INFO tokenizer"))
    if bad:
        first = [ln for ln in lines if not ln.startswith("INFO")][:8]
        return f"FAIL {variant}: {summary}\n  " + "\n  ".join(first), summary, info
    return None, summary, info


def run_all(name, variants, run_one):
    """run_one(variant) -> result lines for each variant; prints them and the verdict; the exit status."""
    fails = 0
    for variant in variants:
        line = run_one(variant)
        print(line, flush=True)
        fails += "FAIL" in line
    print(f"{name}:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


def convert_both(variant, python, peer_src, tandem, hf, ref, got, work, out_dir, extra=()):
    """The peer's converter (HF -> REF) and `tandem convert` (HF -> GOT), both f32, `extra` given to both (e.g.
    --target-model-dir); logs in out_dir. None, or the FAIL line."""
    err = run_llamacpp_converter(python, peer_src, hf, ref, work, Path(out_dir) / f"{variant}_peer.txt", extra)
    if err:
        return f"FAIL {variant}: {err}"
    rc, _, e = run_tandem(tandem, ["convert", hf, "-o", got, "--type", "f32", *extra],
                          Path(out_dir) / f"{variant}_tandem.txt")
    if rc != 0:
        return f"FAIL {variant}: tandem convert exited {rc}: {last_line(e)}"
    return None

