#!/usr/bin/env bash
# diffusion-gemma on the H200 (issue 17, model side). Run from the repo root after run_all.sh built tandem:
#   BIN=build-gpu/bin TESTS=build-gpu/tests OUT=<dir> bash scripts/device/diffusion_gemma.sh
# 1. the GPU tests (tests/gpu/test_gpu_diffusion_gemma.cpp: cuda vs cpu and the double reference, layer and
#    tensor split with 2 ranks sharing cuda:0, SC buffers on the first rank) and the CPU diffusion tests;
# 2. tests/reference/diffusion_gemma_parity.py: transformers' DiffusionGemmaForBlockDiffusion on random weights
#    (tiny, small, and the 26B-A4B shape with 2 layers), saved, `tandem convert`ed, canvas logits of 3 steps
#    compared (UNIFIED and PREFILL+DECODE, host and device SC; each step given transformers' previous logits
#    for self-conditioning, so every step compares alone; the chain of own logits printed) on cpu, cuda, layer,
#    tensor within 1e-3; the tiny spec's fixture goes to $OUT/fixtures for CI
#    (tests/data/models/diffusion_gemma_tiny.{gguf,json}). DG_SPECS limits the specs (comma-separated names).
# Prints a PASS/FAIL line per part. Budget: about 240 s (the GPU tests ~30 s, CPU ~10 s, the parity tiny +
# small ~30 s and the 26B shape ~120 s, last so that a short budget cuts only it).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
TESTS=${TESTS:-build-gpu/tests}
OUT=${OUT:-/tmp/diffusion_gemma_out}
mkdir -p "$OUT"
status=0
part() {  # name, budget, then the command; its output goes to $OUT/<name>.txt
  local name=$1 budget=$2
  shift 2
  local t0=$SECONDS
  if timeout "$budget" "$@" >"$OUT/$name.txt" 2>&1; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name ($((SECONDS - t0)) s; tail of $OUT/$name.txt:)"
    tail -25 "$OUT/$name.txt"
    status=1
  fi
}

part gpu_tests 90 "$TESTS/tandem_gpu_tests" --gtest_filter='GpuDiffusionGemma.*'
part cpu_tests 60 "$TESTS/tandem_tests" --gtest_filter='DiffusionGemma*:ConvertDiffusionGemma*:Gemma4.*'
part parity 200 python3 tests/reference/diffusion_gemma_parity.py --tandem "$BIN/tandem" \
  --tests "$TESTS/tandem_tests" --gpu-tests "$TESTS/tandem_gpu_tests" --out "$OUT/parity" \
  --work /tmp/diffusion_gemma_parity_work --fixtures "$OUT/fixtures" --only "${DG_SPECS:-}"
cp "$OUT/parity/diffusion_gemma_parity_summary.txt" "$OUT/parity_summary.txt" 2>/dev/null
# The probes of transformers (what the 5.17 API looked like) in the summary, for the next fix.
grep -E "^== |config \+ model built|failed|step [0-9]: transformers|tandem convert|rel error|PASS|FAIL" \
  "$OUT/parity/diffusion_gemma_parity.log" 2>/dev/null | grep -v "chained" | head -80
echo "diffusion_gemma device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
