#!/usr/bin/env bash
# Switches of kernel paths, any set of them on or off (run by scripts/device/run_all.sh; BIN, OUT set):
# the whole GPU test binary once per set of SWITCH_SETS, side by side on the same GPU. A set is a comma-separated
# list of VAR=value; sets are separated by spaces. A switch whose run passes everything can become the default.
# Correctness only: timings here are not for the record.
#   SWITCH_SETS (default: the twelfth session's eight, on by default since its GPU run, turned off together
#   (their fallback paths: the ops one at a time, the split-K canvas attention, the register-staged grouped GEMM);
#   TANDEM_SWIGLU_Q8=1, still off, in another; the thirteenth and fourteenth sessions' TANDEM_ROUTE_REGS,
#   TANDEM_COMBINE_PREFETCH and TANDEM_Q8_MMA turned off in a third; the fifteenth session's five that are on by
#   default (TANDEM_NORM_REGS, TANDEM_MOE_TAIL, TANDEM_ATTN_WAVE_FIT, TANDEM_ATTN_HEAD_SPLIT, TANDEM_Q8_MMA_WIDE)
#   turned off in a fourth; and TANDEM_ATTN_FUSED_COMBINE=1, off (slower), in a fifth). A failing set: run its
#   switches one set each.
# (The ninth session's three, TANDEM_RECORD_SHAPES, TANDEM_ID_DIRECT and TANDEM_PDL, passed here in the tenth
# and are on by default too.)
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/switches}; mkdir -p "$OUT"
FILTER=${SWITCH_FILTER:-*}
SETS=${SWITCH_SETS:-"TANDEM_WIDE_ROWS=0,TANDEM_ROW_FUSION=0,TANDEM_ID_GEGLU=0,TANDEM_GEGLU_EPILOGUE=0,TANDEM_FLASH_HD512=0,TANDEM_CANVAS_KV_F16=0,TANDEM_ID_PDL=0,TANDEM_MOE_PIPELINE=0 TANDEM_SWIGLU_Q8=1 TANDEM_ROUTE_REGS=0,TANDEM_COMBINE_PREFETCH=0,TANDEM_Q8_MMA=0 TANDEM_NORM_REGS=0,TANDEM_MOE_TAIL=0,TANDEM_ATTN_WAVE_FIT=0,TANDEM_ATTN_HEAD_SPLIT=0,TANDEM_Q8_MMA_WIDE=0 TANDEM_ATTN_FUSED_COMBINE=1"}
pids=(); names=()
for set in $SETS; do
  name=${set//[=,]/_}
  env ${set//,/ } "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter="$FILTER" >"$OUT/$name.log" 2>&1 &
  pids+=($!); names+=("$name")
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  [ $rc -ne 0 ] && status=1
  echo "--- ${names[$i]}: rc=$rc"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/${names[$i]}.log" | tail -12
done
exit $status
