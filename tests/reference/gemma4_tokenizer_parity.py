#!/usr/bin/env python3
"""Gemma 4 tokenizer parity (issue 16 part B): builds a small Gemma-style tokenizer.json offline with HF
`tokenizers` (BPE with byte_fallback, no prefix space, "▁" for spaces, <bos>/<eos>/<start_of_turn>/<end_of_turn>
specials), converts it with `tandem convert --vocab-only` (config.json model_type gemma4 -> tokenizer.ggml.model
= "gemma4"), and compares `tandem tokenize --ids --no-bos --parse-special` with HF encode(add_special_tokens=False)
on a set of texts (ASCII, newlines, unicode needing byte fallback, chat turns).
Usage: gemma4_tokenizer_parity.py TANDEM_BIN OUT_DIR. Exit 0 and "PASS" when every text matches."""
import json, os, subprocess, sys, tempfile

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

tandem, out_dir = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp()
hf = os.path.join(work, "hf")
os.makedirs(hf)

corpus = ["hello world", "the quick brown fox jumps over the lazy dog", "user model turn", "hello\n\nworld"] * 50
specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
bytes_ = [f"<0x{b:02X}>" for b in range(256)]
# A BPE trained on the corpus, with the 256 byte tokens for fallback (SentencePiece style).
from tokenizers.trainers import BpeTrainer
tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
tok.normalizer = normalizers.Replace(" ", "▁")
tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
trainer = BpeTrainer(vocab_size=400, special_tokens=specials + bytes_, initial_alphabet=list("▁\n"))
tok.train_from_iterator(corpus, trainer)
tok.save(os.path.join(hf, "tokenizer.json"))
json.dump({"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4"}, open(os.path.join(hf, "config.json"), "w"))
json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
          open(os.path.join(hf, "tokenizer_config.json"), "w"))
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
