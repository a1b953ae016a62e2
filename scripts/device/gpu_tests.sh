#!/usr/bin/env bash
# The whole GPU test binary and the CPU test binary on the GPU machine (GCC 13.3 build), then compute-sanitizer
# memcheck over the GPU tests. Run by scripts/device/run_all.sh (BIN, OUT set).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/gpu_tests}; mkdir -p "$OUT"
"$BIN/tandem_gpu_tests" --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1; g=$?
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/gpu_tests.log" | tail -30
echo "tandem_gpu_tests rc=$g"
c=0
if [ "${CPU_CTEST:-1}" = 1 ]; then  # CPU_CTEST=0: a call short of time skips the CPU suite
  (cd build-gpu && ctest -j 12 -LE gpu --timeout 300 >"$OUT/ctest_cpu.log" 2>&1); c=$?
fi
if [ -n "${CPU_GTEST_FILTER:-}" ]; then  # instead of (or beside) the whole CPU suite: the CPU binary's tests that use a GPU
  "$BIN/tandem_tests" --gtest_brief=1 --gtest_filter="$CPU_GTEST_FILTER" >"$OUT/cpu_filtered.log" 2>&1 || c=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]|tests ran" "$OUT/cpu_filtered.log" | tail -12
fi
[ -f "$OUT/ctest_cpu.log" ] && { tail -6 "$OUT/ctest_cpu.log"; grep -E "\(Failed\)|\(Timeout\)|Not Run" "$OUT/ctest_cpu.log" | head -20; }
echo "ctest (CPU tests, GCC 13) rc=$c"
if [ "${MEMCHECK:-1}" = 1 ]; then  # (MEMCHECK=0: not run, nothing printed)
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tandem_gpu_tests" --gtest_brief=1 \
    --gtest_filter="${MEMCHECK_FILTER:-GpuSplit*:CommGpu*:*StepApi*}" >"$OUT/memcheck.log" 2>&1; m=$?
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$OUT/memcheck.log" | tail -5
  echo "memcheck rc=$m"
fi
[ $g -eq 0 ] && [ $c -eq 0 ] && echo "PASS gpu_tests" || echo "FAIL gpu_tests"
