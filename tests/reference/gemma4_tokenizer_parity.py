#!/usr/bin/env python3
"""Gemma 4 tokenizer parity (issue 16 part B): builds a small Gemma-style tokenizer.json offline with HF
`tokenizers` (BPE with byte_fallback, no prefix space, "▁" for spaces, <bos>/<eos>/<start_of_turn>/<end_of_turn>
specials), converts it with `tandem convert --vocab-only` (config.json model_type gemma4 -> tokenizer.ggml.model
= "gemma4"), and compares `tandem tokenize --ids --no-bos --parse-special` with HF encode(add_special_tokens=False)
on a set of texts (ASCII, newlines, unicode needing byte fallback, chat turns).
Usage: gemma4_tokenizer_parity.py TANDEM_BIN OUT_DIR. Exit 0 and "PASS" when every text matches."""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma_tokenizer_json import write_gemma_tokenizer  # noqa: E402

tandem, out_dir = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp()
hf = os.path.join(work, "hf")
tok = write_gemma_tokenizer(hf)
json.dump({"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4"}, open(os.path.join(hf, "config.json"), "w"))
gguf = os.path.join(work, "vocab.gguf")
r = subprocess.run([tandem, "convert", hf, "-o", gguf, "--vocab-only"], capture_output=True, text=True)
if r.returncode != 0:
    print("FAIL: tandem convert --vocab-only:", r.stdout, r.stderr)
    sys.exit(1)

texts = ["hello world", " hello", "hello  world ", "the lazy dog\n\n\nturn", "naïve café — ünïcödé ✓ 日本語",
         "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n", "emoji 🙂 and tabs\tend", "\n", "x"]
bad = 0
with open(os.path.join(out_dir, "gemma4_tok_results.txt"), "w") as log:
    for t in texts:
        want = tok.encode(t, add_special_tokens=False).ids
        r = subprocess.run([tandem, "tokenize", "-m", gguf, "-p", t, "--ids", "--no-bos", "--parse-special"],
                           capture_output=True, text=True)
        got = json.loads(r.stdout.strip()) if r.returncode == 0 else None
        ok = got == want
        bad += not ok
        log.write(f"{'OK ' if ok else 'BAD'} {t!r}\n  hf:     {want}\n  tandem: {got} {r.stderr.strip()}\n")
    sot = tok.token_to_id("<start_of_turn>")
    print(f"specials: <start_of_turn> = {sot}", file=log)
print(("PASS" if bad == 0 else f"FAIL ({bad} of {len(texts)} texts differ)") + " gemma4 tokenizer parity")
sys.exit(1 if bad else 0)
