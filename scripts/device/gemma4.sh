#!/usr/bin/env bash
# gemma4 on the H200 (issue 16 part A). Run from the repo root after the driver built tandem into build-gpu/:
#   BIN=build-gpu/bin OUT=<dir> scripts/device/gemma4.sh
# 1. the gemma4 GPU tests (tests/gpu/test_gpu_gemma4.cpp) and the CPU gemma4 tests;
# 2. tests/reference/gemma4_parity.py: tandem (cpu, cuda:0, layer and tensor split over cuda:0,cuda:0) against
#    transformers' Gemma4ForCausalLM on random weights, logits within 1e-3 relative and 32 greedy tokens equal;
#    writes the CI fixture (gemma4_tiny.gguf/.json) to $OUT/fixtures;
# 3. tandem bench of the 26B-A4B attention/dense shape with 3 layers (no MoE block: tandem has none yet), bf16
#    and q4_k, pp512 / tg128, with --bw 4280 so tg fractions are of 4.28 TB/s (weight bytes per token = the file).
# Prints a PASS/FAIL line per part; results are small text files under $OUT. Budget: about 240 s.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/gemma4_out}
mkdir -p "$OUT"
TESTS=${TESTS:-build-gpu/tests}
status=0
part() {  # name, then the command; its output goes to $OUT/<name>.txt
  local name=$1
  shift
  local t0=$SECONDS
  if timeout 200 "$@" >"$OUT/$name.txt" 2>&1; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name ($((SECONDS - t0)) s; tail of $OUT/$name.txt:)"
    tail -15 "$OUT/$name.txt"
    status=1
  fi
}

part gpu_tests "$TESTS/tandem_gpu_tests" --gtest_filter='GpuGemma4.*'
part cpu_tests "$TESTS/tandem_tests" --gtest_filter='Gemma4.*'
part parity python3 tests/reference/gemma4_parity.py --tandem "$BIN/tandem" --out "$OUT/parity" \
  --work /tmp/gemma4_parity_work --fixtures "$OUT/fixtures"
cp "$OUT/parity/gemma4_parity_summary.txt" "$OUT/parity_summary.txt" 2>/dev/null

# Bench: the parity run left the 26B-A4B-shaped f32 file; random bf16 / q4_k copies of it are benchmarked.
SRC=/tmp/gemma4_parity_work/gemma4_26b_a4b_dense_part/gemma4_26b_a4b_dense_part.gguf
if [ -f "$SRC" ]; then
  for t in bf16 q4_k; do
    dst=/tmp/gemma4_bench_$t.gguf
    if "$BIN/tandem" bench -m "$SRC" --random-weights "$t" --to "$dst" >"$OUT/bench_make_$t.txt" 2>&1; then
      part "bench_$t" "$BIN/tandem" bench -m "$dst" -p 512 -n 128 -r 2 --device cuda:0 --bw 4280
      grep -iE 'tg|pp|bytes|TB/s|%' "$OUT/bench_$t.txt" | head -20
    else
      echo "FAIL bench_$t: could not write random $t weights:"
      tail -5 "$OUT/bench_make_$t.txt"
      status=1
    fi
  done
else
  echo "FAIL bench: $SRC was not written by the parity run"
  status=1
fi
echo "gemma4 device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
