#!/usr/bin/env bash
# The entropy-bound sampler on the H200 (issue 17, sampler side). Run from the repo root after the driver built
# tandem into build-gpu/:  BIN=build-gpu/bin TESTS=build-gpu/tests OUT=<dir> scripts/device/eb_sampler.sh
# 1. tests/gpu/test_gpu_diffusion.cpp (+ the op's older GPU tests): Ops::diffusion_sample_rows on cuda:0 vs the
#    CPU on inputs without near-ties (argmax/sample exact, entropy within 1e-4 relative), ties, strided rows,
#    and the multi-block loop with its logits on cuda:0 equal to the host path;
# 2. the CPU sampler/driver tests (hand-computed decisions, the golden run) built with this machine's GCC;
# 3. tests/reference/eb_sampler_parity.py: given identical logits and draws, transformers 5.17's
#    EntropyBoundSampler / StableAndConfidentStoppingCriteria make the same accept/renoise/stop decisions and
#    final canvas as ours (host reduction), and the device reduction equals the host one (near-ties noted).
# Prints a PASS/FAIL line per part. Budget: about 90 s (180 s given).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/eb_sampler_out}
TESTS=${TESTS:-build-gpu/tests}
mkdir -p "$OUT"
status=0
part() {  # name, then the command; its output goes to $OUT/<name>.txt
  local name=$1
  shift
  local t0=$SECONDS
  if timeout 150 "$@" >"$OUT/$name.txt" 2>&1 && ! grep -q "\[  SKIPPED \]" "$OUT/$name.txt"; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name ($((SECONDS - t0)) s; tail of $OUT/$name.txt:)"
    tail -25 "$OUT/$name.txt"
    status=1
  fi
}

part gpu_tests "$TESTS/tandem_gpu_tests" --gtest_filter='GpuDiffusion.*:GpuOps.DiffusionSampleRows:GpuOps.SmallSamplingForSanitizer'
grep "device loop" "$OUT/gpu_tests.txt" || true
part cpu_tests "$TESTS/tandem_tests" --gtest_filter='EbSampler.*:EbReducer.*:Diffuse.*:EbGolden.*:DiffuseCli.*'
part parity python3 tests/reference/eb_sampler_parity.py --bin "$BIN/tandem" --out "$OUT/parity" --device cuda:0
grep -E "^(PASS|FAIL)|^    " "$OUT/parity.txt" | head -60

if [ $status -eq 0 ]; then echo "eb_sampler.sh: PASS"; else echo "eb_sampler.sh: FAIL"; fi
exit $status
