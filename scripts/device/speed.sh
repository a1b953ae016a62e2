#!/usr/bin/env bash
# Issue 19 (batch-1 decode speed) on the GPU machine, run by scripts/device/run_all.sh (BIN, OUT set;
# LLAMA_CPP_BIN / LLAMA_CPP_SRC set there by PEER=1):
#   1. the GPU tests of the decode kernels (fused products, matmul, attention, ops, model parity);
#   2. bench/compare_llamacpp.sh: llama-bench and tandem bench on the same random Qwen3-8B files;
#   3. `tandem bench --kernels` (each kernel alone, GB/s against the copy bandwidth);
#   4. tg at depth 8192 and 32768 (bf16), and tg with programmatic dependent launch on (TANDEM_PDL=1);
#   5. when nsys is on the machine, the per-kernel time table of decode steps (tg of the bf16 file).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/speed}; mkdir -p "$OUT"
export MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
echo "=== $(date +%T) GPU tests"
timeout 150 "$BIN/tandem_gpu_tests" \
  --gtest_filter='GpuFusedGemv*:GpuDecodeFusion*:GpuMatmul*:GpuAttention*:GpuOps*:GpuModel*:GpuShippedModel*:GpuSplit*:GpuStepApi*:GpuDevice*:SpecGpu*:*GpuModel*' \
  >"$OUT/gpu_tests.log" 2>&1
echo "exit $?"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|error" "$OUT/gpu_tests.log" | head -40
grep -E "^\[       OK|^\[  FAILED" "$OUT/gpu_tests.log" | tail -60
# The whole-model tests again with programmatic dependent launch on (TANDEM_PDL=1; off by default), and with the
# fused ops off (TANDEM_NO_FUSED=1): when a run fails, these say which change it is.
models='*GpuModel*:GpuStepApi*:GpuSplit*:SpecGpu*:GpuShippedModel*'
for env in "TANDEM_PDL=1" "TANDEM_NO_FUSED=1"; do
  echo "--- model tests with $env"
  env $env timeout 60 "$BIN/tandem_gpu_tests" --gtest_filter="$models" >"$OUT/gpu_tests_${env// /_}.log" 2>&1
  grep -E "^\[  (PASSED|FAILED)|parity|^\[  FAILED" "$OUT/gpu_tests_${env// /_}.log" | head -12
done

echo "=== $(date +%T) compare with llama.cpp"
TANDEM="$BIN/tandem" OUT="$OUT/compare" REPS=${REPS:-1} LLAMA_WAIT=${LLAMA_WAIT:-100} bash bench/compare_llamacpp.sh 2>&1 |
  tail -40

echo "=== $(date +%T) kernels alone (Qwen3-8B shapes)"
timeout 100 "$BIN/tandem" bench --kernels -o md >"$OUT/kernels.md" 2>&1
echo "exit $?"; grep -E "^\||GB/s|rror" "$OUT/kernels.md" | head -60

echo "=== $(date +%T) decode at depth (goal: 8k and 32k within 15% of the short context), bf16"
for d in 8192 32768; do
  timeout 100 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-bf16.gguf" -p 0 -n 64 -b 1 -r 1 -d $d -o md \
    >"$OUT/depth_$d.md" 2>&1
  echo "exit $?"; grep -E "^\| tg" "$OUT/depth_$d.md"
done
echo "=== $(date +%T) programmatic dependent launch on (TANDEM_PDL=1), bf16 and q4_k tg"
for t in bf16 q4_k; do
  TANDEM_PDL=1 timeout 60 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 128 -b 1 -r 1 -o md \
    >"$OUT/pdl_$t.md" 2>&1
  echo "$t exit $?"; grep -E "^\| tg" "$OUT/pdl_$t.md"
done

if command -v nsys >/dev/null 2>&1; then
  echo "=== $(date +%T) nsys: kernels of 32 decode steps (bf16)"
  f="$MODEL_DIR/qwen3-8b-bf16.gguf"
  timeout 120 nsys profile -o "$OUT/decode" -t cuda --force-overwrite true \
    "$BIN/tandem" bench -m "$f" -p 0 -n 32 -b 1 -r 1 >"$OUT/nsys.log" 2>&1
  timeout 60 nsys stats -r cuda_gpu_kern_sum -f csv "$OUT/decode.nsys-rep" >"$OUT/nsys_kernels.csv" 2>>"$OUT/nsys.log"
  python3 - "$OUT/nsys_kernels.csv" <<'EOF' | tee "$OUT/nsys_kernels.md"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next((i for i, r in enumerate(rows) if r and r[0].startswith("Time")), None)
if hdr is None: sys.exit(print("no kernel table"))
h = rows[hdr]; data = rows[hdr + 1:]
ti, ni, ai, nm = h.index("Time (%)"), h.index("Instances"), h.index("Avg (ns)"), h.index("Name")
print("| time % | calls | avg us | kernel |\n| ---: | ---: | ---: | --- |")
for r in data[:25]:
    print(f"| {r[ti]} | {r[ni]} | {float(r[ai]) / 1000:.2f} | {r[nm][:90]} |")
EOF
else
  echo "(no nsys on this machine: no per-kernel table)"
fi

echo "=== $(date +%T) done"
