#!/usr/bin/env bash
# Issue 19 on the H200: the wide-piece quantized decode products (src/backend/cuda/gemv_quant_wide.cu: 256
# values per lane and piece for Q8_0 / Q4_K / Q5_K) against the block-per-lane path they replace
# (TANDEM_NO_QUANT_WIDE=1), in one call, after run_all.sh built tandem (BIN, OUT set) and with PREP_MODELS=1
# (the Qwen3-8B-shape files made in /dev/shm/tandem-models in the background):
#   1. the whole GPU test binary (wide on);
#   2. tandem bench tg128 (and pp512) on the q8_0 and q4_k files, wide on and off, bf16 as the control;
#   3. greedy ids of the shipped small model, CPU vs CUDA, q8_0 and a q4_k / q5_k copy (how many of 48 equal);
#   4. bf16 decode at depth 8192 / 32768 and batch 32 against batch 1 (issue 19 goals never measured before);
#   5. the kernels alone (tandem bench --kernels), wide on; the product tests with the old path (wide off); the
#      kernels alone with the old path — each while time is left (WIDE_LIMIT seconds).
# Budget: ~330 s after the build. The essential numbers go to $FINAL_OUT/quant_wide_summary.txt as they come (that
# folder comes back even when the call is cut short) and are printed at the end.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/quant_wide}; mkdir -p "$OUT"
M=${MODEL_DIR:-/dev/shm/tandem-models}
LIMIT=${WIDE_LIMIT:-300}  # seconds: optional parts are skipped past it
S="${FINAL_OUT:-$OUT}/quant_wide_summary.txt"; : >"$S"
say() { echo "$*" | tee -a "$S"; }
late() { [ $SECONDS -gt "$LIMIT" ] && say "(skipped: $1, ${SECONDS}s used)"; }
say "=== $(date +%T) $("$BIN/tandem" --version 2>/dev/null | head -1)"

echo "=== $(date +%T) 1. GPU tests, wide pieces on"
"$BIN/tandem_gpu_tests" --gtest_brief=1 >"$OUT/gpu_tests_wide.log" 2>&1; rc=$?
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$OUT/gpu_tests_wide.log" | tail -12
grep -E "FAILED  \]|Failure|Expected|which is" "$OUT/gpu_tests_wide.log" | head -12 | cut -c1-300 >>"$S"
say "tandem_gpu_tests (wide on): rc=$rc, $(grep -E '^\[  PASSED' "$OUT/gpu_tests_wide.log" | head -1)"
echo "=== $(date +%T) waiting for the Qwen3-8B-shape files"
for _ in $(seq 240); do [ -f "$M/.ready" ] && break; sleep 1; done
ls -la "$M" | tee -a "$OUT/models.txt"

echo "=== $(date +%T) 2. tg128 / pp512, batch 1, wide on and off"
row() {  # label, bench .md file: the tg / pp rows
  grep -E "^\| (tg|pp)" "$2" | sed "s/^/$1 /" | tee -a "$S"
}
for t in q8_0 q4_k bf16; do
  f="$M/qwen3-8b-$t.gguf"
  [ -f "$f" ] || { say "no $f"; continue; }
  timeout 90 "$BIN/tandem" bench -m "$f" -p 512 -n 128 -b 1 -r 1 -o md >"$OUT/bench_${t}_wide.md" 2>&1
  row "$t wide" "$OUT/bench_${t}_wide.md"
  [ $t = bf16 ] && continue
  TANDEM_NO_QUANT_WIDE=1 timeout 90 "$BIN/tandem" bench -m "$f" -p 0 -n 128 -b 1 -r 1 -o md \
    >"$OUT/bench_${t}_direct.md" 2>&1
  row "$t direct" "$OUT/bench_${t}_direct.md"
done
grep -hE "GB/s|limit" "$OUT/bench_q8_0_wide.md" | head -3

echo "=== $(date +%T) 3. greedy ids, CPU vs CUDA (shipped small model)"
small=models/tandem-small-q8_0.gguf
prompt="The history of the city begins with a small settlement on the river, where"
for q in q8_0 q4_k q5_k; do
  f=$small
  if [ $q != q8_0 ]; then f="$OUT/small-$q.gguf"; "$BIN/tandem" quantize "$small" "$f" $q -q >/dev/null 2>&1; fi
  for d in cpu cuda:0; do
    timeout 30 "$BIN/tandem" generate -m "$f" --devices "$d" -p "$prompt" -n 48 --temp 0 --ids --ignore-eos \
      2>/dev/null | head -1 >"$OUT/ids_${q}_${d%%:*}.txt"
  done
  python3 - "$OUT/ids_${q}_cpu.txt" "$OUT/ids_${q}_cuda.txt" "$q" <<'EOF' | tee -a "$S"
import sys
a, b = (open(p).read().split() for p in sys.argv[1:3])
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print(f"greedy ids small {sys.argv[3]}: {n}/48 leading ids equal on cpu and cuda ({len(a)} / {len(b)} ids)")
EOF
done
rm -f "$OUT"/small-*.gguf

late "depth and batch" || {
  echo "=== $(date +%T) 4. bf16 decode at depth and at batch 32"
  for d in 8192 32768; do
    timeout 60 "$BIN/tandem" bench -m "$M/qwen3-8b-bf16.gguf" -p 0 -n 64 -b 1 -r 1 -d $d -o md \
      >"$OUT/depth_$d.md" 2>&1
    row "bf16 depth $d" "$OUT/depth_$d.md"
  done
  timeout 60 "$BIN/tandem" bench -m "$M/qwen3-8b-bf16.gguf" -p 0 -n 64 -b 1,32 -r 1 -o md >"$OUT/batch.md" 2>&1
  row "bf16 batch" "$OUT/batch.md"
}

for mode in wide; do
  late "kernel table ($mode)" && break
  echo "=== $(date +%T) 5. kernels alone ($mode)"
  env $([ $mode = direct ] && echo TANDEM_NO_QUANT_WIDE=1) timeout 100 "$BIN/tandem" bench --kernels -o md \
    >"$OUT/kernels_$mode.md" 2>&1
  grep -E "^\| (matmul|fused|swiglu)[^|]*(q8_0|q4_k|q5_k|q6_k|q4_0)" "$OUT/kernels_$mode.md" | grep -E "T=(1|8) " |
    sed "s/^/$mode /" | tee -a "$S"
done

late "product tests, wide off" || {
TANDEM_NO_QUANT_WIDE=1 "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter='GpuFusedGemv.*:GpuMatmul.*' \
  >"$OUT/gpu_tests_direct.log" 2>&1; rc=$?
grep -E "FAILED  \]" "$OUT/gpu_tests_direct.log" | tail -6
say "GpuFusedGemv / GpuMatmul (wide off): rc=$rc, $(grep -E '^\[  PASSED' "$OUT/gpu_tests_direct.log" | head -1)"

}

for mode in direct; do
  late "kernel table ($mode)" && break
  echo "=== $(date +%T) 5. kernels alone ($mode)"
  env $([ $mode = direct ] && echo TANDEM_NO_QUANT_WIDE=1) timeout 100 "$BIN/tandem" bench --kernels -o md \
    >"$OUT/kernels_$mode.md" 2>&1
  grep -E "^\| (matmul|fused|swiglu)[^|]*(q8_0|q4_k|q5_k|q6_k|q4_0)" "$OUT/kernels_$mode.md" | grep -E "T=(1|8) " |
    sed "s/^/$mode /" | tee -a "$S"
done

echo "=== $(date +%T) done; summary:"
cat "$S"
