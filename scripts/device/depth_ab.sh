#!/usr/bin/env bash
# Decode speed at depth (issue 19: within 15% of the short-context speed at 8k and 32k), each way of DEPTH_AB
# (default: the defaults, then TANDEM_ATTN_WAVE_FIT=0), on the Qwen3-8B-shape files of bench/models.sh
# (MODELS, default /dev/shm/tandem-models; PREP_MODELS=1 in run_all.sh makes them). Run by run_all.sh (BIN,
# OUT set). DEPTHS (default "0 8192 32768"), DEPTH_TYPES (default bf16). Prints one table row per (type, way,
# depth): tandem bench's tg32 line.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/depth_ab}; mkdir -p "$OUT"
M=${MODELS:-/dev/shm/tandem-models}
status=0
for t in ${DEPTH_TYPES:-bf16}; do
  f=$M/qwen3-8b-$t.gguf
  [ -f "$f" ] || { echo "SKIP $t: no $f"; status=1; continue; }
  for way in default ${DEPTH_AB:-TANDEM_ATTN_WAVE_FIT=0}; do
    envs=""; [ "$way" != default ] && envs=$way
    for d in ${DEPTHS:-0 8192 32768}; do
      env $envs timeout 90 "$BIN/tandem" bench -m "$f" -p 0 -n 32 -d "$d" -b 1 -r 2 -o md \
        >"$OUT/${t}_${way//[=,]/_}_d$d.md" 2>&1 || status=1
      echo "$t $way d=$d: $(grep -E '^\| tg' "$OUT/${t}_${way//[=,]/_}_d$d.md" | head -1)"
    done
  done
done
exit $status
