#!/usr/bin/env bash
# Gemma 4 interop with llama.cpp (issue 16), on the H200 after run_all.sh built tandem (and, with a PEER_BUILD, the
# peer's llama-server; PEER=src gives only its converter): tests/reference/gemma4_interop.py, dense and MoE:
# the same random HF checkpoint converted by llama.cpp's convert_hf_to_gguf.py and by `tandem convert` (f32);
# tandem runs both files (logits within 1e-3 of transformers, 32 greedy tokens equal); llama-server runs both
# files (greedy tokens equal to transformers', top-8 probabilities within 2e-3). Then the key/tensor diff of the
# two files (scripts/device/gemma4_convert.sh).
# Env: BIN, OUT, LLAMA_CPP_SRC (required), LLAMA_CPP_BIN (llama-server; without it the llama.cpp-side check
# FAILs as not run). Budget: about 150 s. Prints PASS/FAIL per check; results under $OUT.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/gemma4_interop_out}
mkdir -p "$OUT"
if [ -z "${LLAMA_CPP_SRC:-}" ] || [ ! -f "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" ]; then
  echo "FAIL: LLAMA_CPP_SRC is not a llama.cpp tree with convert_hf_to_gguf.py (run_all.sh with PEER=src)"
  exit 1
fi
LB=()
if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-server" ]; then LB=(--llama-bin "$LLAMA_CPP_BIN"); fi
status=0
timeout 200 python3 tests/reference/gemma4_interop.py --tandem "$BIN/tandem" --llama-src "$LLAMA_CPP_SRC" "${LB[@]}" \
  --out "$OUT" --work /tmp/gemma4_interop_work >"$OUT/interop.txt" 2>&1 || status=1
grep -E "^(PASS|FAIL)|interop:|Error|error" "$OUT/interop.txt" | head -30
OUT="$OUT/convert_diff" bash scripts/device/gemma4_convert.sh || status=1
rm -rf /tmp/gemma4_interop_work
echo "gemma4_interop device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
