#!/usr/bin/env bash
# The switches that are off by default until a GPU run checks them (run by scripts/device/run_all.sh; BIN, OUT
# set): the whole GPU test binary with TANDEM_RECORD_SHAPES=1 and TANDEM_ID_DIRECT=1 (issues 18 and 16), and,
# side by side on the same GPU, the whole binary again with TANDEM_PDL=1 (issue 19). A switch whose run passes
# everything can become the default. Correctness only: timings here are not for the record.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/switches}; mkdir -p "$OUT"
FILTER=${SWITCH_FILTER:-*}
TANDEM_RECORD_SHAPES=1 TANDEM_ID_DIRECT=1 "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter="$FILTER" \
  >"$OUT/record_id_direct.log" 2>&1 &
p1=$!
TANDEM_PDL=1 "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter="$FILTER" >"$OUT/pdl.log" 2>&1 &
p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
for f in record_id_direct pdl; do
  echo "--- $f"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/$f.log" | tail -12
done
echo "TANDEM_RECORD_SHAPES=1 TANDEM_ID_DIRECT=1 rc=$r1; TANDEM_PDL=1 rc=$r2"
