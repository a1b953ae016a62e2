#!/usr/bin/env bash
# Hardening checks that need the GPU (issue 15): CUDA out of memory at load names what did not fit (weights,
# KV cache / --ctx, working buffers / --batch), the bytes needed and free, and `tandem generate` exits 1 with
# that message. tests/gpu/test_gpu_out_of_memory.cpp takes the GPU's memory itself (cudaMalloc) for a real
# shortage. Also re-runs the CPU hardening tests on this machine's compiler (Ubuntu 24.04, GCC 13.3).
# env: BIN (build-gpu/bin), OUT (results folder). Runtime: about 30 s after the build.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/hardening_out}
mkdir -p "$OUT"
TESTS=$(dirname "$BIN")/tests
fail=0
timeout 120 "$TESTS/tandem_gpu_tests" --gtest_filter='GpuOutOfMemory.*:GpuDevice.NameMemoryAndOutOfMemoryError' \
  >"$OUT/gpu_oom.log" 2>&1
rc=$?
grep "^\[ message  \]" "$OUT/gpu_oom.log" | cut -c1-400  # what a user reads, for each shortage
if [ $rc -eq 0 ] && grep -q "PASSED" "$OUT/gpu_oom.log" && ! grep -q "SKIPPED" "$OUT/gpu_oom.log"; then
  echo "PASS GpuOutOfMemory ($(grep -c '^\[       OK' "$OUT/gpu_oom.log") tests)"
else
  echo "FAIL GpuOutOfMemory rc=$rc"; grep -E "Failure|Expected|which is|in: |FAILED|SKIPPED" "$OUT/gpu_oom.log" | head -30
  fail=1
fi
timeout 150 "$TESTS/tandem_tests" \
  --gtest_filter='CliHardening.*:NonFinite.*:Jinja.*:ConvertErrors.*:GgufErrors.*:TokenizerConvertErrors.*' \
  >"$OUT/cpu_hardening.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  echo "PASS CPU hardening tests on $(gcc --version | head -1) ($(grep -c '^\[       OK' "$OUT/cpu_hardening.log") tests)"
else
  echo "FAIL CPU hardening tests rc=$rc"; grep -E "FAILED|Failure" "$OUT/cpu_hardening.log" | head -20
  fail=1
fi
[ $fail -eq 0 ] && echo "hardening: PASS" || echo "hardening: FAIL"
exit $fail
