#!/usr/bin/env bash
# Issue 19's CPU goal: the shipped small model (models/tandem-small-q8_0.gguf, the embedded default) on the CPU at
# least as fast as llama.cpp's CPU build on the same GGUF with the same threads. On the H200 machine's 16 cores,
# or here on the development machine (BIN=build/bin THREADS=2). Budget ~90 s.
# Prints one row per thread count and "PASS cpu_compare" when tandem's tg128 >= llama.cpp's at every count
# (pp512 is printed, not judged).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/cpu_compare}; mkdir -p "$OUT"
M=${MODEL:-models/tandem-small-q8_0.gguf}
THREADS=${THREADS:-"4 8 16"}
echo "model $M ($(stat -c %s "$M") bytes); CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"

# llama.cpp's CPU llama-bench (-DGGML_CUDA=OFF: a CUDA build offloads the prompt's products to the GPU even with
# -ngl 0) comes from LLAMA_CPP_CPU_BIN; no committed script builds the fetched peer (the fetch library's rule).
lbench=""
[ -n "${LLAMA_CPP_CPU_BIN:-}" ] && [ -x "$LLAMA_CPP_CPU_BIN/llama-bench" ] && lbench="$LLAMA_CPP_CPU_BIN/llama-bench"
[ -z "$lbench" ] && { echo "no CPU llama-bench: tandem only"; }

status=0
for t in $THREADS; do
  timeout 60 "$BIN/tandem" bench -m "$M" --device cpu -t "$t" -p 512 -n 128 -b 1 -r 3 -o json \
    >"$OUT/tandem_t$t.json" 2>"$OUT/tandem_t$t.err"
  read -r tg pp < <(python3 - "$OUT/tandem_t$t.json" <<'EOF'
import json, sys
try:
    res = json.load(open(sys.argv[1]))["results"]
except Exception:
    res = []
get = lambda p: next((f"{r['tokens_per_s']:.1f}" for r in res if r["test"].startswith(p) and r["batch"] == 1), "NA")
print(get("tg"), get("pp"))
EOF
)
  ltg=NA; lpp=NA
  if [ -n "$lbench" ]; then
    timeout 60 "$lbench" -m "$M" -ngl 0 -t "$t" -p 512 -n 128 -r 3 -o json >"$OUT/llama_t$t.json" \
      2>"$OUT/llama_t$t.err"
    read -r ltg lpp < <(python3 - "$OUT/llama_t$t.json" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception:
    rows = []
tg = next((f"{r['avg_ts']:.1f}" for r in rows if r.get("n_gen", 0) > 0), "NA")
pp = next((f"{r['avg_ts']:.1f}" for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), "NA")
print(tg, pp)
EOF
)
  fi
  ratio=$(python3 -c "print(f'{$tg / $ltg:.2f}x' if '$tg' != 'NA' and '$ltg' != 'NA' else '-')" 2>/dev/null)
  echo "threads $t: tandem tg128 $tg pp512 $pp t/s | llama.cpp tg128 $ltg pp512 $lpp t/s | tg ratio ${ratio:--}"
  python3 -c "import sys; sys.exit(0 if '$tg' != 'NA' and '$ltg' != 'NA' and $tg >= $ltg else 1)" 2>/dev/null ||
    status=1
done
[ $status -eq 0 ] && echo "PASS cpu_compare" || echo "FAIL cpu_compare (tandem slower, or a side did not run)"
exit $status
