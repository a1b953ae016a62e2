#!/usr/bin/env python3
"""Token-id parity between tandem's tokenizer and Hugging Face `tokenizers`.

Run from the repository root on the GPU machine (Python with tokenizers and transformers; no internet needed):

    python3 tests/reference/tokenizer_parity.py --out /tmp/tokparity

What it does:
  1. builds a >= 2 MB corpus of mixed text (tokenizer_corpus.py; one text per line);
  2. trains tokenizers with HF `tokenizers`: byte-level BPE with GPT-2 pre-tokenization and with Llama-3 regex
     pre-tokenization (vocab 1k and 32k each), and SentencePiece-style BPE (byte_fallback, "▁" spaces, prefix
     space, as Llama-2 tokenizer.json files are written; vocab 1k and 32k);
  3. converts each tokenizer.json to a vocab-only GGUF with `tandem convert --vocab-only` (the tandem binary is
     built with CMake unless --tandem is given; if that build fails, a small tool with the same converter and
     tokenizer code is built from tests/reference/tokenizer_tool);
  4. tokenizes every line with tandem (`tandem tokenize --lines --no-bos --parse-special --roundtrip`) and with
     HF (add_special_tokens=False; HF always splits added tokens out of the text, hence --parse-special);
  5. compares the ids line by line and checks decode(encode(x)) == x in tandem, prints a summary, writes
     summary.json, mismatches.jsonl, and CI fixtures (small GGUFs + expected ids) under OUT/fixtures.
Exit status 0 when every line of every tokenizer matches.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import SPECIAL_MARKUP, make_corpus  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS_BYTE_LEVEL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def log(*a):
    print(*a, flush=True)


# ---- building the tool ------------------------------------------------------------------------------------

def build_tool(args):
    """Returns (kind, path): kind "tandem" (the real binary) or "standalone" (tests/reference/tokenizer_tool).

    With --tool auto both are built at once (the tandem binary may not build while other parts of the tree are
    being worked on); the tandem binary is used when it builds."""
    if args.tandem:
        standalone = "tokenizer_tool" in os.path.basename(args.tandem)
        return ("standalone" if standalone else "tandem"), os.path.abspath(args.tandem)
    os.makedirs(args.build_dir, exist_ok=True)
    jobs = args.jobs
    builds = {}
    if args.tool in ("auto", "tandem"):
        bdir = os.path.join(args.build_dir, "tandem")
        env = dict(os.environ)
        deps = ""
        if args.deps:
            deps = f"-DCMAKE_PREFIX_PATH={args.deps} "
            env["PKG_CONFIG_PATH"] = os.path.join(args.deps, "lib", "pkgconfig")
        cmd = (f"cmake -S {REPO} -B {bdir} -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_TESTS=OFF -DTANDEM_WERROR=OFF "
               f"{deps}-DCMAKE_BUILD_TYPE=Release > {bdir}.log 2>&1 && "
               f"cmake --build {bdir} --target tandem_cli -j{jobs} >> {bdir}.log 2>&1")
        builds["tandem"] = (subprocess.Popen(cmd, shell=True, env=env), bdir, os.path.join(bdir, "bin", "tandem"))
    if args.tool in ("auto", "standalone"):
        bdir = os.path.join(args.build_dir, "standalone")
        src = os.path.join(REPO, "tests", "reference", "tokenizer_tool")
        deps = f"-DTOKDEPS={args.deps} " if args.deps else ""
        cmd = (f"cmake -S {src} -B {bdir} -G Ninja {deps}-DCMAKE_BUILD_TYPE=Release > {bdir}.log 2>&1 && "
               f"cmake --build {bdir} -j{max(1, jobs // 2) if len(builds) else jobs} >> {bdir}.log 2>&1")
        builds["standalone"] = (subprocess.Popen(cmd, shell=True), bdir, os.path.join(bdir, "tandem_tokenizer_tool"))
    t0 = time.time()
    ok = {}
    for kind, (proc, bdir, path) in builds.items():
        rc = proc.wait()
        log(f"build {kind}: rc={rc} after {time.time() - t0:.1f}s (log {bdir}.log)")
        if rc == 0:
            ok[kind] = path
        else:
            subprocess.call(f"grep -m8 -E 'error|undefined|not found|Could not' {bdir}.log", shell=True)
    for kind in ("tandem", "standalone"):
        if kind in ok:
            return kind, ok[kind]
    sys.exit("no tool could be built")


def convert(tool, hf_dir, out_gguf):
    kind, path = tool
    if kind == "tandem":
        cmd = [path, "convert", hf_dir, "-o", out_gguf, "--vocab-only", "-q"]
    else:
        cmd = [path, "convert-vocab", hf_dir, "-o", out_gguf]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")


def tandem_ids(tool, gguf, lines_file):
    """ids per line and the round-trip flag per line."""
    cmd = [tool[1], "tokenize", "-m", gguf, "-f", lines_file, "--lines", "--no-bos", "--parse-special", "--roundtrip"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True)
    secs = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"tokenize failed: {' '.join(cmd)}\n{r.stderr.decode(errors='replace')}")
    out = []
    for row in r.stdout.decode().split("\n")[:-1]:
        ids, _, ok = row.partition("\t")
        out.append(([int(x) for x in ids.split()], ok == "1"))
    return out, secs


# ---- training with HF tokenizers --------------------------------------------------------------------------

def train_byte_level(lines, vocab_size, style):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS_BYTE_LEVEL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    j = json.loads(tok.to_str())
    if style == "llama3":
        j["model"]["ignore_merges"] = True  # as Llama 3's tokenizer.json
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_bos_token": False, "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n"
                                                        "{{ m.content }}<|im_end|>\n{% endfor %}"}
    return j, config


def train_sentencepiece(lines, vocab_size):
    """BPE trained on Metaspace words, rewritten the way Llama-2 tokenizer.json files look: <unk> <s> </s>, the
    256 <0xXX> byte tokens, the learned tokens; Prepend("▁") + Replace(" ", "▁") normalizer; byte_fallback."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    limit_alphabet = 150 if vocab_size <= 2000 else 1000
    # The chat markup is special from the start, so training never learns it as an ordinary token.
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=specials,
                                  limit_alphabet=limit_alphabet, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    trained = json.loads(tok.to_str())
    old_vocab = trained["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for text, _ in sorted(old_vocab.items(), key=lambda kv: kv[1]):
        if text not in vocab:
            vocab[text] = len(vocab)
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in specials]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": trained["model"]["merges"]},
    }
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
              "add_eos_token": False}
    return j, config


# ---- comparison -------------------------------------------------------------------------------------------

def run_one(name, tool, lines, texts, lines_file, train_texts, vocab_size, style, out):
    from tokenizers import Tokenizer

    t0 = time.time()
    if style == "spm":
        j, config = train_sentencepiece(train_texts, vocab_size)
    else:
        j, config = train_byte_level(train_texts, vocab_size, style)
    hf_dir = os.path.join(out, "tokenizers", name)
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    hf = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    train_secs = time.time() - t0
    gguf = os.path.join(out, "gguf", name + ".gguf")
    os.makedirs(os.path.dirname(gguf), exist_ok=True)
    convert(tool, hf_dir, gguf)

    t0 = time.time()
    hf_ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    hf_secs = time.time() - t0
    td, td_secs = tandem_ids(tool, gguf, lines_file)
    assert len(td) == len(texts), f"tandem returned {len(td)} lines for {len(texts)}"

    added = SPECIAL_MARKUP + ["<s>", "</s>", "<unk>"]
    mismatches, roundtrip_fail, roundtrip_fail_special, n_tokens = [], [], 0, 0
    per_cat = {}
    for i, ((cat, text), hf_line, (td_line, rt_ok)) in enumerate(zip(lines, hf_ids, td)):
        n_tokens += len(hf_line)
        c = per_cat.setdefault(cat, [0, 0])
        c[0] += 1
        if hf_line != td_line:
            c[1] += 1
            if len(mismatches) < 200:
                mismatches.append({"tokenizer": name, "line": i, "category": cat, "text": text, "hf": hf_line,
                                   "tandem": td_line, "hf_tokens": hf.encode(text, add_special_tokens=False).tokens})
        if not rt_ok:
            # With a SentencePiece prefix space, text after a special token gets a space of its own (as in
            # llama.cpp and HF), so such lines cannot round-trip; they are counted apart.
            if style == "spm" and any(s in text for s in added):
                roundtrip_fail_special += 1
            elif len(roundtrip_fail) < 50:
                roundtrip_fail.append({"tokenizer": name, "line": i, "category": cat, "text": text})
            else:
                roundtrip_fail.append(None)
    res = {"tokenizer": name, "style": style, "vocab_requested": vocab_size, "vocab_size": hf.get_vocab_size(),
           "lines": len(texts), "tokens": n_tokens, "mismatched_lines": sum(c[1] for c in per_cat.values()),
           "roundtrip_failures": len(roundtrip_fail), "roundtrip_failures_after_special_spm": roundtrip_fail_special,
           "per_category": {k: {"lines": v[0], "mismatches": v[1]} for k, v in per_cat.items()},
           "train_s": round(train_secs, 2), "hf_encode_s": round(hf_secs, 2), "tandem_tokenize_s": round(td_secs, 2),
           "gguf_bytes": os.path.getsize(gguf)}
    return res, mismatches, [r for r in roundtrip_fail if r], hf, gguf


def write_fixture(name, gguf, hf, lines, out, rng, per_category=24):
    """A small GGUF and expected ids for CI (tests/data/tokenizer)."""
    fdir = os.path.join(out, "fixtures")
    os.makedirs(fdir, exist_ok=True)
    shutil.copy(gguf, os.path.join(fdir, name + ".gguf"))
    by_cat = {}
    for cat, text in lines:
        if len(text) <= 300:
            by_cat.setdefault(cat, []).append(text)
    chosen = []
    for cat in sorted(by_cat):
        pool = by_cat[cat]
        chosen += rng.sample(pool, min(per_category, len(pool)))
    chosen += ["", " ", "a" * 700, "1234567890" * 30, "😀" * 50, "  leading and trailing  "]
    with open(os.path.join(fdir, name + ".expected.jsonl"), "w", encoding="utf-8") as f:
        for text in chosen:
            ids = hf.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids}) + "\n")


def write_results(out, makeup, total, tool, version, results, problems):
    """Written after every tokenizer, so a run cut short still leaves what it found."""
    summary = {"corpus": {k: {"lines": n, "bytes": b} for k, (n, b) in makeup.items()}, "corpus_bytes": total,
               "tool": tool[0], "tokenizers_version": version, "results": results}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "mismatches.jsonl"), "w", encoding="utf-8") as f:
        for m in problems:
            f.write(json.dumps(m) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "tokenizer_parity_out"), help="output directory")
    ap.add_argument("--build-dir", default=None, help="where to build (default OUT/../tokparity_build)")
    ap.add_argument("--tandem", default=None, help="use this tandem binary (or tandem_tokenizer_tool) instead of building one")
    ap.add_argument("--tool", choices=["auto", "tandem", "standalone"], default="auto",
                    help="auto: build tandem, fall back to the standalone tokenizer tool if that fails")
    ap.add_argument("--deps", default=None,
                    help="folder with nlohmann-json, CLI11 and PCRE2 (include/, lib/, share/cmake/) for a machine "
                         "without those Debian packages (default: .tokdeps in the repository, if present)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size factor (1.0: about 3 MB)")
    ap.add_argument("--only", default=None, help="comma-separated tokenizer names to run")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if args.build_dir is None:
        args.build_dir = os.path.join(os.path.dirname(out), "tokparity_build")
    args.build_dir = os.path.abspath(args.build_dir)
    if args.deps is None and os.path.isdir(os.path.join(REPO, ".tokdeps")):
        args.deps = os.path.join(REPO, ".tokdeps")
    if args.deps:
        args.deps = os.path.abspath(args.deps)

    import tokenizers
    log(f"tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}")
    lines, makeup = make_corpus(scale=args.scale)
    texts = [t for _, t in lines]
    total = sum(b for _, b in makeup.values())
    log("corpus make-up:")
    for cat, (n, b) in makeup.items():
        log(f"  {cat:34s} {n:7d} lines {b:9d} bytes")
    log(f"  {'total':34s} {len(lines):7d} lines {total:9d} bytes")
    lines_file = os.path.join(out, "corpus_lines.txt")
    with open(lines_file, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(texts) + "\n")
    # Train on a deterministic 80% of the lines (the rest are unseen text), compare on all of them.
    rng = random.Random(99)
    train_texts = [t for t in texts if rng.random() < 0.8]

    tool = build_tool(args)
    log(f"tool: {tool[0]} {tool[1]}")
    configs = [("gpt2-1k", 1000, "gpt2"), ("gpt2-32k", 32000, "gpt2"), ("llama3-1k", 1000, "llama3"),
               ("llama3-32k", 32000, "llama3"), ("spm-1k", 1000, "spm"), ("spm-32k", 32000, "spm")]
    if args.only:
        keep = set(args.only.split(","))
        configs = [c for c in configs if c[0] in keep]
    results, all_mis, all_rt = [], [], []
    for name, vs, style in configs:
        try:
            res, mis, rt, hf, gguf = run_one(name, tool, lines, texts, lines_file, train_texts, vs, style, out)
        except Exception as e:  # keep going: one failing tokenizer should not hide the others' results
            log(f"{name}: ERROR {e}")
            results.append({"tokenizer": name, "error": str(e)})
            continue
        results.append(res)
        all_mis += mis
        all_rt += rt
        log(f"{name}: vocab {res['vocab_size']}, {res['lines']} lines, {res['tokens']} tokens, "
            f"mismatched lines {res['mismatched_lines']}, round-trip failures {res['roundtrip_failures']} "
            f"(+{res['roundtrip_failures_after_special_spm']} SPM lines with special tokens), "
            f"train {res['train_s']}s, HF {res['hf_encode_s']}s, tandem {res['tandem_tokenize_s']}s")
        for m in mis[:5]:
            log(f"    line {m['line']} [{m['category']}] {m['text'][:80]!r}")
            log(f"      hf     {m['hf'][:24]}\n      tandem {m['tandem'][:24]}\n      hf tokens {m['hf_tokens'][:16]}")
        if name.endswith("-1k"):
            write_fixture(name, gguf, hf, lines, out, random.Random(5))
        write_results(out, makeup, total, tool, tokenizers.__version__, results, all_mis + all_rt)
    write_results(out, makeup, total, tool, tokenizers.__version__, results, all_mis + all_rt)
    ok = all("error" not in r and r["mismatched_lines"] == 0 and r["roundtrip_failures"] == 0 for r in results)
    log("PARITY: " + ("all lines identical, all round-trips exact" if ok else "MISMATCHES (see mismatches.jsonl)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
