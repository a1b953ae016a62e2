#!/usr/bin/env bash
# The variant built by scripts/device/variant_build.sh: its GPU tests (VARIANT_FILTER; default the kernels a
# decode step runs), then tandem bench tg128 on the Qwen3-8B-shape files, main's build and the variant's
# alternating on each file (same warm machine, same minute), and the decode attention kernel alone.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/variant_check}; mkdir -p "$OUT"
VBIN=/tmp/variant-src/build/bin
MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
[ -x "$VBIN/tandem" ] || { echo "no variant build"; exit 1; }
GT=/tmp/variant-src/build/tests/tandem_gpu_tests
"$GT" --gtest_brief=1 --gtest_filter="${VARIANT_FILTER:-*Attention*:*Gemv*:*Matmul*:*Quant*:*Decode*}" >"$OUT/gpu_tests.log" 2>&1
g=$?
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/gpu_tests.log" | tail -20
echo "variant gpu tests rc=$g"
[ $g -eq 0 ] || echo "VARIANT TESTS FAIL: timings below are of a wrong kernel"
for t in ${TYPES:-q8_0 q4_k bf16}; do
  f="$MODEL_DIR/qwen3-8b-$t.gguf"; [ -f "$f" ] || continue
  for who in main variant main variant; do
    b=$BIN; [ $who = variant ] && b=$VBIN
    r=$(timeout 60 "$b/tandem" bench -m "$f" -p 0 -n 128 -b 1 -r 1 -o md 2>/dev/null | grep -E "^\| tg" | head -1)
    echo "$t $who: $r"
  done
done
for who in main variant; do
  b=$BIN; [ $who = variant ] && b=$VBIN
  timeout 60 "$b/tandem" bench --kernels-only attention -o md >"$OUT/attn_$who.md" 2>&1
  grep -E "^\| attention 1 seq x 1 rows" "$OUT/attn_$who.md" | sed "s/^/$who /"
done
for who in main variant; do
  b=$BIN; [ $who = variant ] && b=$VBIN
  timeout 90 "$b/tandem" bench --kernels-only matmul -o md >"$OUT/matmul_$who.md" 2>&1
  grep -E "^\| matmul .*T=1 " "$OUT/matmul_$who.md" | sed "s/^/$who /" | head -12
done
exit $g
