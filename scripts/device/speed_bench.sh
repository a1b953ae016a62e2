#!/usr/bin/env bash
# Issue 19, measurement half (run by scripts/device/run_all.sh, BIN and OUT set; LLAMA_CPP_BIN / LLAMA_CPP_SRC
# set by your PEER_BUILD; ~300 s; needs only the tandem binary). In order of importance:
#   0. a sanity check (the call may have no test binary): greedy ids of the shipped small model (q8_0, and
#      q4_k / bf16 quantized from it) on the CPU and on CUDA, the number of equal leading ids of 48;
#   1. bench/compare_llamacpp.sh: tandem bench and llama-bench (-fa 1 -ngl 99), tg128 and pp512, on the same
#      random Qwen3-8B-shape files (bf16, q8_0, q4_k), one table with the ratio and the fraction of bandwidth;
#   2. the per-kernel time of real decode steps (nsys, when the machine has it; else, or with SPEED_KERNELS=1,
#      each kernel alone: `tandem bench --kernels`, run last), bf16;
#   3. tg at depth 8192 and 32768 (goal: within 15% of the short context), bf16 (llama-bench -d 8192 beside);
#   4. batch 32 against batch 1 (goal: >= 25x), bf16;
#   5. decode attention alone at 4k / 8k / 32k positions for several split lengths (TANDEM_ATTN_SPLIT);
#   6. speculative decoding on the shipped small pair (DFlash draft-max 7, draft model 4), cuda:0;
#   7. tg128 with each default of SPEED_OFF switched off (default TANDEM_PDL=0 on q8_0, q4_k, bf16; SPEED_PDL=0
#      skips the part): the A/B of the defaults in the same call.
# Parts 3-7 and the kernel table (run last) are skipped once SPEED_LIMIT (210) seconds have gone.
# The last lines printed (what run_all.sh's summary shows) are the essential numbers ($OUT/summary.txt).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/speed_bench}; mkdir -p "$OUT"
export MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
S="$OUT/summary.txt"; : >"$S"
LIMIT=${SPEED_LIMIT:-210}  # seconds: later optional parts are skipped past it (the topic's budget is ~270 s)
# SPEED_SKIP="depth batch PDL": parts not wanted in this call (their names as late() prints them)
late() {
  case " ${SPEED_SKIP:-} " in *" $1 "*) echo "(skipped: $1, SPEED_SKIP)" | tee -a "$S"; return 0 ;; esac
  [ $SECONDS -gt "$LIMIT" ] && echo "(skipped: $1, ${SECONDS}s used)" | tee -a "$S"
}
echo "=== $(date +%T) $("$BIN/tandem" --version 2>/dev/null | head -1)" | tee -a "$S"

late sanity || {
echo "=== $(date +%T) sanity: greedy ids, CPU vs CUDA (shipped small model)"
small=models/tandem-small-q8_0.gguf
"$BIN/tandem" quantize "$small" "$OUT/small-q4_k.gguf" q4_k -q >/dev/null 2>&1
"$BIN/tandem" quantize "$small" "$OUT/small-bf16.gguf" bf16 -q >/dev/null 2>&1
prompt="The history of the city begins with a small settlement on the river, where"
for f in "$small" "$OUT/small-q4_k.gguf" "$OUT/small-bf16.gguf"; do
  [ -f "$f" ] || { echo "sanity: no $f" | tee -a "$S"; continue; }
  for d in cpu cuda:0; do
    timeout 30 "$BIN/tandem" generate -m "$f" --devices "$d" -p "$prompt" -n 48 --temp 0 --ids --ignore-eos \
      2>/dev/null | head -1 >"$OUT/ids_$(basename "$f" .gguf)_${d%%:*}.txt"
  done
  python3 - "$OUT/ids_$(basename "$f" .gguf)_cpu.txt" "$OUT/ids_$(basename "$f" .gguf)_cuda.txt" "$(basename "$f")" <<'EOF' | tee -a "$S"
import sys
a, b = (open(p).read().split() for p in sys.argv[1:3])
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
ok = len(a) == 48 and len(b) == 48 and n >= 16
print(f"sanity {sys.argv[3]}: {n}/48 leading greedy ids equal on cpu and cuda ({'ok' if ok else 'SUSPECT'})")
EOF
done
rm -f "$OUT"/small-*.gguf
}

echo "=== $(date +%T) compare with llama.cpp (tg128, pp512, batch 1)"
# SPEED_TYPES, not TYPES: gemma4_moe_bench.sh's TYPES (bf16 q4_k_m) in the same call named files this one lacks
TYPES="${SPEED_TYPES:-bf16 q8_0 q4_k}" TANDEM="$BIN/tandem" OUT="$OUT/compare" REPS=${REPS:-1} LLAMA_WAIT=${LLAMA_WAIT:-120} bash bench/compare_llamacpp.sh 2>&1 |
  tail -30
grep -E "^\| (bf16|q8_0|q4_k) " "$OUT/compare/compare.md" >>"$S" 2>/dev/null
lbench=""
for d in "${LLAMA_CPP_BIN:-}" "${LLAMA_CPP_SRC:+$LLAMA_CPP_SRC/build/bin}"; do
  [ -n "$d" ] && [ -x "$d/llama-bench" ] && { lbench="$d/llama-bench"; break; }
done

NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys \
  /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  for t in ${NSYS_TYPES:-bf16}; do
    echo "=== $(date +%T) nsys: kernels of 32 decode steps ($t), graph nodes traced"
    timeout 60 "$NSYS" profile -o "$OUT/decode_$t" -t cuda --cuda-graph-trace=node --force-overwrite true \
      "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 32 -b 1 -r 1 >"$OUT/nsys_$t.log" 2>&1
    timeout 45 "$NSYS" stats -r cuda_gpu_kern_sum -f csv -o "$OUT/nsys_$t" "$OUT/decode_$t.nsys-rep" \
      >>"$OUT/nsys_$t.log" 2>&1
    python3 - "$OUT/nsys_${t}_cuda_gpu_kern_sum.csv" "$t" "$S" <<'EOF' | tee "$OUT/nsys_kernels_$t.md"
import csv, sys
try:
    rows = [r for r in csv.reader(open(sys.argv[1])) if r]
except OSError:
    sys.exit(print("no kernel table"))
h = rows[0]; data = rows[1:]
ti, ni, ai, tot, nm = (h.index(k) for k in ("Time (%)", "Instances", "Avg (ns)", "Total Time (ns)", "Name"))
total = sum(float(r[tot]) for r in data)
print(f"all kernels: {total / 1e6:.2f} ms over the run (40 decode steps: 8 warm-up + 32 timed, plus set-up), "
      f"{total / 1e6 / 40:.3f} ms per step if the decode steps are all of it\n")
print("| time % | calls | avg us | total ms | kernel |\n| ---: | ---: | ---: | ---: | --- |")
for r in data[:22]:
    print(f"| {r[ti]} | {r[ni]} | {float(r[ai]) / 1e3:.2f} | {float(r[tot]) / 1e6:.2f} | {r[nm][:100]} |")
with open(sys.argv[3], "a") as s:
    s.write(f"nsys {sys.argv[2]}: kernels {total / 1e6 / 40:.3f} ms/step; top: " +
            "; ".join(f"{r[nm].split('(')[0].split('<')[0][-28:]} {r[ti]}% {float(r[ai]) / 1e3:.1f}us"
                      for r in data[:5]) + "\n")
EOF
    rm -f "$OUT/decode_$t.nsys-rep" "$OUT/decode_$t.sqlite"
  done
fi
late depth || {
echo "=== $(date +%T) decode at depth (goal: 8k and 32k within 15% of the short context), bf16, tg64"
for d in 8192 32768; do
  timeout 45 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-bf16.gguf" -p 0 -n 64 -b 1 -r 1 -d $d -o md \
    >"$OUT/depth_$d.md" 2>&1
  echo "tandem d=$d exit $?"; grep -E "^\| tg" "$OUT/depth_$d.md" | tee -a "$S"
done
if [ -n "$lbench" ]; then
  timeout 45 "$lbench" -m "$MODEL_DIR/qwen3-8b-bf16.gguf" -fa 1 -ngl 99 -p 0 -n 64 -d 8192 -r 1 -o md \
    >"$OUT/llama_depth_8192.md" 2>"$OUT/llama_depth_8192.err"
  echo "llama.cpp d=8192 exit $?"; grep -E "tg64" "$OUT/llama_depth_8192.md" | sed 's/^/llama.cpp /' | tee -a "$S"
fi
}

late batch || {
echo "=== $(date +%T) batch 32 against batch 1 (goal >= 25x), tg64"
for t in bf16; do
  timeout 45 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 64 -b 1,32 -r 1 -o md >"$OUT/batch_$t.md" 2>&1
  echo "$t exit $?"; grep -E "^\| tg" "$OUT/batch_$t.md" | sed "s/^/$t /" | tee -a "$S"
done
}

late attention || {
echo "=== $(date +%T) decode attention alone, ctx 4k / 8k / 32k, by positions per split (TANDEM_ATTN_SPLIT; default"
echo "    first; no_octet: TANDEM_ATTN_NO_OCTET=1, the paired output pass instead of the octet one)"
for L in default no_octet 32 64 128 256; do
  split=$L; [ "$L" = default ] || [ "$L" = no_octet ] && split=""
  no_octet=0; [ "$L" = no_octet ] && no_octet=1
  TANDEM_ATTN_SPLIT=$split TANDEM_ATTN_NO_OCTET=$no_octet timeout 60 "$BIN/tandem" bench --kernels-only attention \
    -o md >"$OUT/attn_split_$L.md" 2>&1
  echo "split $L exit $?"
  grep -E "^\| attention 1 seq x 1 rows" "$OUT/attn_split_$L.md" | awk -F'|' -v L="$L" \
    '{printf "attention split %s:%s: %s us (graph %s us), %s of bw\n", L, $2, $3, $8, $5}' | tee -a "$S"
done
}

late spec || {
echo "=== $(date +%T) speculative decoding on the shipped small pair (cuda:0): speedup over AR, per cycle"
# (record 1, the default since the tenth session: the drafter's block-mask and feature-row steps replayed as CUDA
# graphs; record 0 runs them directly)
for spec in "dflash 7 models/tandem-small-dflash-q8_0.gguf 1" "draft 4 models/tandem-draft-q8_0.gguf 1"; do
  set -- $spec
  TANDEM_RECORD_SHAPES=$4 timeout 40 "$BIN/tandem" bench -m models/tandem-small-q8_0.gguf --draft "$3" --draft-max "$2" \
    -p 0 -n 128 -b 1 -r 2 --device cuda:0 >"$OUT/spec_$1_record$4.md" 2>&1
  echo "spec $1 record $4 exit $?"
  echo "spec $1 draft-max $2 record $4: $(grep -o 'speedup over AR[^|]*' "$OUT/spec_$1_record$4.md" | head -1); $(grep -o 'mean accepted length [0-9.]*' "$OUT/spec_$1_record$4.md" | head -1); $(grep 'per cycle:' "$OUT/spec_$1_record$4.md" | head -1)" | tee -a "$S"
done
}

# Each default switched off in turn (SPEED_OFF="ENV=0:types ..."; default: PDL on all three files), tg128: the
# A/B of each default in the same call.
if [ "${SPEED_PDL:-1}" = 1 ] && ! late PDL; then
  for spec in ${SPEED_OFF:-TANDEM_PDL=0:q8_0,q4_k,bf16}; do
    sw=${spec%%:*}; types=${spec#*:}
    echo "=== $(date +%T) $sw, tg128"
    for t in ${types//,/ }; do
      late "$sw $t" && break
      env "$sw" timeout 40 "$BIN/tandem" bench -m "$MODEL_DIR/qwen3-8b-$t.gguf" -p 0 -n 128 -b 1 -r 1 -o md \
        >"$OUT/off_${sw%%=*}_$t.md" 2>&1
      echo "$t exit $?"; grep -E "^\| tg" "$OUT/off_${sw%%=*}_$t.md" | sed "s/^/$sw $t /" | tee -a "$S"
    done
  done
fi
if { [ -z "$NSYS" ] || [ "${SPEED_KERNELS:-0}" = 1 ]; } && ! late "kernel table"; then
  echo "=== $(date +%T) kernels alone (Qwen3-8B shapes; no nsys on this machine)"
  timeout $((LIMIT + 60 - SECONDS)) "$BIN/tandem" bench --kernels -o md >"$OUT/kernels.md" 2>&1
  echo "exit $?"; grep -E "^\| (matmul|fused|attention|swiglu)|GB/s|rror" "$OUT/kernels.md" | grep -vE "T=(32|512)" | head -50
  grep -E "^\| matmul (bf16|q8_0|q4_k) \{(4096, 12288|12288, 4096)\} T=1 |^\| attention 1 seq" "$OUT/kernels.md" |
    awk -F'|' '{printf "kernel%s:%s%%\n", $2, $5}' >>"$S"
fi

echo "=== $(date +%T) done; summary:"
cat "$S"
