#!/usr/bin/env bash
# gemma4 on the H200 (issue 16). Run from the repo root after the driver built tandem into build-gpu/:
#   BIN=build-gpu/bin OUT=<dir> scripts/device/gemma4.sh
# 1. the gemma4 and MoE GPU tests (tests/gpu/test_gpu_gemma4.cpp, test_gpu_moe.cpp) and the CPU ones;
# 2. tests/reference/gemma4_parity.py, mixture-of-experts specs first (gemma4_moe_tiny, gemma4_moe_small, the
#    26B-A4B shape with 2 layers; the small ones also through `tandem convert`) and the E2B-style spec
#    (per-layer inputs, KV sharing; cpu, cuda, tensor), then the dense specs: tandem
#    (cpu, cuda:0, layer and tensor split over cuda:0,cuda:0) against transformers' Gemma4ForCausalLM on random
#    weights, logits within 1e-3 relative and 32 greedy tokens equal; writes the CI fixtures
#    (gemma4_tiny.*, gemma4_moe_tiny.*) to $OUT/fixtures.
# The 26B-A4B speed runs are scripts/device/gemma4_moe_bench.sh.
# GEMMA4_QUICK=1: only the small specs (gemma4_moe_tiny, gemma4_moe_small with convert; gemma4_tiny with its
# tensor split under --replicate-kv): about 120 s.
# Prints a PASS/FAIL line per part; results are small text files under $OUT. Budget: about 420 s (MoE parity
# about 200 s with the 6 GB f32 26B-A4B file, dense parity about 120 s, tests about 60 s).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/gemma4_out}
mkdir -p "$OUT"
TESTS=${TESTS:-build-gpu/tests}
status=0
MOE_SPECS=gemma4_moe_tiny,gemma4_moe_small,gemma4_e2b_tiny,gemma4_26b_a4b_moe
DENSE_SPECS=gemma4_tiny,gemma4_small,gemma4_26b_a4b_dense_part
if [ "${GEMMA4_QUICK:-0}" = 1 ]; then
  MOE_SPECS=gemma4_moe_tiny,gemma4_moe_small
  DENSE_SPECS=gemma4_tiny
fi
part() {  # name, time limit (s), then the command; its output goes to $OUT/<name>.txt
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name ($((SECONDS - t0)) s; tail of $OUT/$name.txt:)"
    tail -15 "$OUT/$name.txt"
    status=1
  fi
}

part gpu_tests 200 "$TESTS/tandem_gpu_tests" --gtest_filter='GpuGemma4.*:GpuMoe.*'
part cpu_tests 200 "$TESTS/tandem_tests" --gtest_filter='Gemma4*:*CpuMoeOps*:*Gemma4HfFixture*:DiffusionGemma.Moe*:ConvertGemma4.*'
part parity_moe 300 python3 tests/reference/gemma4_parity.py --tandem "$BIN/tandem" --out "$OUT/parity_moe" \
  --work /tmp/gemma4_parity_work --fixtures "$OUT/fixtures" \
  --only "$MOE_SPECS"
cp "$OUT/parity_moe/gemma4_parity_summary.txt" "$OUT/parity_moe_summary.txt" 2>/dev/null
grep -E "config used|rel error|ERROR|convert" "$OUT/parity_moe.txt" | head -40
rm -rf /tmp/gemma4_parity_work/gemma4_26b_a4b_moe  # 6 GB
part parity_dense 200 python3 tests/reference/gemma4_parity.py --tandem "$BIN/tandem" --out "$OUT/parity" \
  --work /tmp/gemma4_parity_work --fixtures "$OUT/fixtures" --only "$DENSE_SPECS"
cp "$OUT/parity/gemma4_parity_summary.txt" "$OUT/parity_summary.txt" 2>/dev/null
echo "gemma4 device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
