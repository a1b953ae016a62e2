#!/usr/bin/env bash
# Issue 19 (batch-1 decode speed) on the GPU machine in one topic, run by scripts/device/run_all.sh (BIN, OUT set;
# LLAMA_CPP_BIN / LLAMA_CPP_SRC set by your PEER_BUILD): speed_check.sh (the GPU tests, ~150 s), then
# speed_bench.sh (llama.cpp side by side, batch, depth, per-kernel times, ~300 s). A call short of time runs
# the two as separate topics instead: TOPICS="speed_check:170 speed_bench:330".
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/speed}; mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
OUT="$OUT/check" bash "$here/speed_check.sh"
c=$?
OUT="$OUT/bench" bash "$here/speed_bench.sh"
[ $c -eq 0 ] && echo "PASS speed (check)" || echo "FAIL speed (check; the bench numbers are of a tree that failed)"
exit $c
