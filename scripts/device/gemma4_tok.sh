#!/usr/bin/env bash
# Gemma 4 tokenizer parity with Hugging Face tokenizers (issue 16 part B), on the GPU machine (HF tokenizers is
# installed there). Env: BIN (tandem binaries, default build-gpu/bin), OUT (results). Budget: about 60 s.
# Prints PASS/FAIL; per-text ids in $OUT/gemma4_tok_results.txt.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/gemma4_tok}
mkdir -p "$OUT"
if timeout 60 python3 tests/reference/gemma4_tokenizer_parity.py "$BIN/tandem" "$OUT" 2>&1 | tee "$OUT/gemma4_tok_summary.txt" | tail -5 && grep -q '^PASS' "$OUT/gemma4_tok_summary.txt"; then
  echo "gemma4_tok: PASS"
else
  echo "gemma4_tok: FAIL (see $OUT/gemma4_tok_summary.txt, $OUT/gemma4_tok_results.txt)"
  exit 1
fi
