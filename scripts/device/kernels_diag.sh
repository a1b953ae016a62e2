#!/usr/bin/env bash
# Which kernel group of `tandem bench --kernels` fails, and at which launch: each group alone, then again with
# CUDA_LAUNCH_BLOCKING=1 when it failed (the error then surfaces at the launch that caused it). Run by
# scripts/device/run_all.sh (BIN, OUT set); correctness only, timings here are not for the record.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/kernels_diag}; mkdir -p "$OUT"
for g in ${GROUPS_TO_CHECK:-matmul swiglu attention}; do
  [ "$g" = none ] && continue
  timeout 120 "$BIN/tandem" bench --kernels-only "$g" -o md >"$OUT/$g.md" 2>&1
  rc=$?
  echo "group $g rc=$rc"
  if [ $rc -ne 0 ]; then
    tail -3 "$OUT/$g.md"
    CUDA_LAUNCH_BLOCKING=1 timeout 150 "$BIN/tandem" bench --kernels-only "$g" -o md >"$OUT/${g}_blocking.md" 2>&1
    echo "group $g blocking rc=$?"; grep -E "^\| " "$OUT/${g}_blocking.md" | tail -2; tail -3 "$OUT/${g}_blocking.md"
  fi
done
# Each group alone passes (ninth session) while all groups in one process fail: the whole table under
# compute-sanitizer memcheck names the first bad access (kernel, thread, address).
if [ "${KERNELS_MEMCHECK:-1}" = 1 ]; then
  timeout ${KERNELS_MEMCHECK_S:-240} compute-sanitizer --tool memcheck --print-limit 5 "$BIN/tandem" bench --kernels -o md \
    >"$OUT/memcheck_all.md" 2>&1
  echo "memcheck over bench --kernels rc=$?"
  grep -nE "=========|ERROR SUMMARY" "$OUT/memcheck_all.md" | head -40
fi
