#!/usr/bin/env bash
# The converter comparisons of tests/reference/*_convert_diff.py (issues 16, 17, 18) on a machine with real
# transformers (the H200 image): there llama.cpp's converter reads config.json through transformers' AutoConfig
# (its defaults filled in) and the tokenizer through AutoTokenizer, where the development machine's runs used
# the stand-in of convert_diff_util.py. Gemma 4 (four checkpoint kinds) and DFlash against llama.cpp's converter;
# DiffusionGemma against the fork's when DG_FORK_SRC names a tree of it (warshanks/llama.cpp cc727430).
# Env: BIN, OUT, LLAMA_CPP_SRC (required), LLAMA_CPP_BIN (optional: llama.cpp also runs tandem's Gemma 4
# files), DG_FORK_SRC (optional). Budget: about 60 s. Prints PASS/FAIL per variant; results under $OUT.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/convert_diffs_out}
mkdir -p "$OUT"
if [ -z "${LLAMA_CPP_SRC:-}" ] || [ ! -f "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" ]; then
  echo "FAIL: LLAMA_CPP_SRC is not a llama.cpp tree with convert_hf_to_gguf.py (run_all.sh with PEER=src)"
  exit 1
fi
LB=()
if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -f "$LLAMA_CPP_BIN/libllama.so" ]; then LB=(--llama-bin "$LLAMA_CPP_BIN"); fi
status=0
timeout 200 python3 tests/reference/gemma4_convert_diff.py --tandem "$BIN/tandem" --llama-src "$LLAMA_CPP_SRC" \
  "${LB[@]}" --out "$OUT/gemma4" || status=1
timeout 200 python3 tests/reference/dflash_convert_diff.py --tandem "$BIN/tandem" --llama-src "$LLAMA_CPP_SRC" \
  --out "$OUT/dflash" || status=1
if [ -n "${DG_FORK_SRC:-}" ]; then
  timeout 200 python3 tests/reference/diffusion_gemma_convert_diff.py --tandem "$BIN/tandem" \
    --fork-src "$DG_FORK_SRC" --out "$OUT/diffusion_gemma" || status=1
else
  echo "(DG_FORK_SRC not set: the DiffusionGemma converter comparison did not run)"
fi
echo "convert_diffs device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
