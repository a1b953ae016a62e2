#!/usr/bin/env bash
# Issue 19, measurement half (run by scripts/device/run_all.sh, BIN and OUT set; LLAMA_CPP_BIN / LLAMA_CPP_SRC
# set there by PEER=1; ~300 s). Run it after speed_check (its numbers mean something only when that passed):
#   1. bench/compare_llamacpp.sh: tandem bench and llama-bench (-fa 1 -ngl 99), tg128 and pp512, on the same
#      random Qwen3-8B-shape files (bf16, q8_0, q4_k), one table with the ratio and the fraction of bandwidth;
#   2. batch 32 against batch 1 (goal: >= 25x), bf16 and q4_k;
#   3. tg at depth 8192 and 32768 (goal: within 15% of the short context), bf16, tandem and llama-bench -d;
#   4. the per-kernel time of real decode steps (nsys, when the machine has it; else, or with SPEED_KERNELS=1,
#      each kernel alone: `tandem bench --kernels`, GB/s against the copy bandwidth);
#   5. tg again with programmatic dependent launch on (TANDEM_PDL=1; SPEED_PDL=0 skips it), last.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/speed_bench}; mkdir -p "$OUT"
export MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
echo "=== $(date +%T) tandem $("$BIN/tandem" --version 2>/dev/null | head -1)"

echo "=== $(date +%T) compare with llama.cpp (tg128, pp512, batch 1)"
TANDEM="$BIN/tandem" OUT="$OUT/compare" REPS=${REPS:-1} LLAMA_WAIT=${LLAMA_WAIT:-150} bash bench/compare_llamacpp.sh 2>&1 |
  tail -30
lbench=""
for d in "${LLAMA_CPP_BIN:-}" "${LLAMA_CPP_SRC:+$LLAMA_CPP_SRC/build/bin}"; do
  [ -n "$d" ] && [ -x "$d/llama-bench" ] && { lbench="$d/llama-bench"; break; }
done

echo "=== $(date +%T) batch 32 against batch 1 (goal >= 25x), tg64"
for t in bf16 q4_k; do
  timeout 60 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 64 -b 1,32 -r 1 -o md >"$OUT/batch_$t.md" 2>&1
  echo "$t exit $?"; grep -E "^\| tg" "$OUT/batch_$t.md"
done

echo "=== $(date +%T) decode at depth (goal: 8k and 32k within 15% of the short context), bf16, tg64"
for d in 8192 32768; do
  timeout 60 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-bf16.gguf" -p 0 -n 64 -b 1 -r 1 -d $d -o md \
    >"$OUT/depth_$d.md" 2>&1
  echo "tandem d=$d exit $?"; grep -E "^\| tg" "$OUT/depth_$d.md"
  if [ -n "$lbench" ]; then
    timeout 60 "$lbench" -m "$MODEL_DIR/qwen3-8b-bf16.gguf" -fa 1 -ngl 99 -p 0 -n 64 -d $d -r 1 -o md \
      >"$OUT/llama_depth_$d.md" 2>"$OUT/llama_depth_$d.err"
    echo "llama.cpp d=$d exit $?"; grep -E "tg64" "$OUT/llama_depth_$d.md"
  fi
done

NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  for t in bf16 q4_k; do
    echo "=== $(date +%T) nsys: kernels of 32 decode steps ($t), whole step"
    timeout 90 "$NSYS" profile -o "$OUT/decode_$t" -t cuda --cuda-graph-trace=node --force-overwrite true \
      "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 32 -b 1 -r 1 >"$OUT/nsys_$t.log" 2>&1
    timeout 60 "$NSYS" stats -r cuda_gpu_kern_sum -f csv -o "$OUT/nsys_$t" "$OUT/decode_$t.nsys-rep" >>"$OUT/nsys_$t.log" 2>&1
    python3 - "$OUT/nsys_${t}_cuda_gpu_kern_sum.csv" <<'EOF' | tee "$OUT/nsys_kernels_$t.md"
import csv, sys
try:
    rows = [r for r in csv.reader(open(sys.argv[1])) if r]
except OSError:
    sys.exit(print("no kernel table"))
h = rows[0]; data = rows[1:]
ti, ni, ai, tot, nm = (h.index(k) for k in ("Time (%)", "Instances", "Avg (ns)", "Total Time (ns)", "Name"))
print("| time % | calls | avg us | total ms | kernel |\n| ---: | ---: | ---: | ---: | --- |")
total = sum(float(r[tot]) for r in data)
print(f"all kernels: {total / 1e6:.2f} ms over the run (40 decode steps: 8 warm-up + 32 timed, plus set-up), "
      f"{total / 1e6 / 40:.3f} ms per step if the decode steps are all of it\n")
for r in data[:22]:
    print(f"| {r[ti]} | {r[ni]} | {float(r[ai]) / 1e3:.2f} | {float(r[tot]) / 1e6:.2f} | {r[nm][:100]} |")
EOF
    rm -f "$OUT/decode_$t.nsys-rep" "$OUT/decode_$t.sqlite"
  done
else
  echo "(no nsys on this machine: the per-kernel table below is each kernel alone)"
fi

if [ -z "$NSYS" ] || [ "${SPEED_KERNELS:-0}" = 1 ]; then
  echo "=== $(date +%T) kernels alone (Qwen3-8B shapes)"
  timeout 90 "$BIN/tandem" bench --kernels -o md >"$OUT/kernels.md" 2>&1
  echo "exit $?"; grep -E "^\| (matmul|fused|attention|swiglu)|GB/s|rror" "$OUT/kernels.md" | grep -vE "T=(32|512)" | head -50
fi

if [ "${SPEED_PDL:-1}" = 1 ]; then
  echo "=== $(date +%T) programmatic dependent launch on (TANDEM_PDL=1), tg128"
  for t in bf16 q4_k; do
    TANDEM_PDL=1 timeout 60 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 128 -b 1 -r 1 -o md \
      >"$OUT/pdl_$t.md" 2>&1
    echo "$t exit $?"; grep -E "^\| tg" "$OUT/pdl_$t.md"
  done
fi
echo "=== $(date +%T) done"
