#!/usr/bin/env bash
# The tensor-core Q8_0 products of 8..16 columns (gemv_quant_mma.cu, on by default) against the direct kernel,
# on a Qwen3-8B-shape Q8_0 target with random weights (run by scripts/device/run_all.sh; BIN, OUT set):
#   1. tandem bench tg at batch 1, 2, 4, 8, 16 (BATCHES: others; one decode step of B sequences), each way;
#   2. scripts/device/dflash_8b.sh each way: the draft pass (16 rows, not batch-invariant), the verify pass per
#      block size (batch-invariant target) and the cycle, from which the speedup at each accepted length.
# AB_ENV (default TANDEM_Q8_MMA=0, the direct kernel and below it the dequantize + cuBLAS path): the second way. Budget ~220 s (the files ~20 s once).
set -u
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/q8_mma_bench}; mkdir -p "$OUT"
AB=${AB_ENV:-TANDEM_Q8_MMA=0}
export MODELS=${MODELS:-/dev/shm/tandem-8b}
S="$OUT/summary.txt"; : >"$S"
# the target file first (dflash_8b.sh makes its files again when they are gone: it removes them at its end)
T=$MODELS/qwen3-8b-random-q8_0.gguf
mkdir -p "$MODELS"
[ -f "$T" ] || python3 bench/make_random_q8_gguf.py qwen3-8b "$T" >"$OUT/files.txt" 2>&1
[ -f "$T" ] || { echo "FAIL: no $T"; cat "$OUT/files.txt"; exit 1; }
for way in default "$AB"; do
  envs=""; [ "$way" != default ] && envs=$way
  name=${way//[=,]/_}
  env $envs timeout 60 "$BIN/tandem" bench -m "$T" -p 0 -n 32 -b "${BATCHES:-1,2,4,8,16}" -r 1 -o md >"$OUT/batch_$name.md" 2>&1
  echo "batch ($way) exit $?"; grep -E "^\| tg" "$OUT/batch_$name.md" | sed "s/^/$way /" | tee -a "$S"
done
for way in ${DFLASH_WAYS:-default $AB}; do  # (DFLASH_WAYS="$AB": the default way measured already)
  envs=""; [ "$way" != default ] && envs=$way
  name=${way//[=,]/_}
  env $envs DFLASH_8B_BUDGET=${DFLASH_8B_BUDGET:-75} OUT="$OUT/dflash_$name" bash scripts/device/dflash_8b.sh \
    >"$OUT/dflash_$name.log" 2>&1
  echo "dflash ($way) exit $?"; sed "s/^/$way /" "$OUT/dflash_$name/table.md" 2>/dev/null | tee -a "$S"
done
echo "--- summary"; cat "$S"
