#!/usr/bin/env bash
# tandem against llama.cpp on the same GGUF files (issue 19), on the GPU machine, in one call:
#   1. llama-bench from $LLAMA_CPP_BIN (a CUDA build of llama.cpp you made; this script does not build it);
#   2. random-weight Qwen3-8B-shape files made or reused by bench/models.sh (FAST_QUANT=1: the q8_0 / q4_k files
#      are random valid blocks from `tandem bench --random-weights`; every matrix of the q4_k file is Q4_K, where a
#      real Q4_K_M keeps some in Q6_K: it stands for Q4_K_M here, slightly fewer bytes);
#   3. `llama-bench -fa 1 -ngl 99 -p 512 -n 128` and `tandem bench -p 512 -n 128 -b 1` on each file;
#   4. one table: t/s of both, tandem / llama.cpp, and each one's fraction of the bandwidth limit at tg
#      (weight bytes read per token / time / the copy bandwidth tandem measured).
# usage: [LLAMA_CPP_BIN=dir] [TANDEM=build-gpu/bin/tandem] [MODEL_DIR=/dev/shm/tandem-models]
#        [TYPES="bf16 q8_0 q4_k"] [SHAPE=qwen3-8b] [REPS=2] [OUT=dir] bash bench/compare_llamacpp.sh
set -uo pipefail
TANDEM=${TANDEM:-build-gpu/bin/tandem}
MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
TYPES=${TYPES:-"bf16 q8_0 q4_k"}
SHAPE=${SHAPE:-qwen3-8b}
REPS=${REPS:-2}
OUT=${OUT:-/tmp/compare_llamacpp}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)

find_lbench() {
  if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-bench" ]; then echo "$LLAMA_CPP_BIN/llama-bench"
  elif [ -n "${LLAMA_CPP_SRC:-}" ] && [ -x "$LLAMA_CPP_SRC/build/bin/llama-bench" ]; then echo "$LLAMA_CPP_SRC/build/bin/llama-bench"
  fi
}
# llama-bench is never built here: no committed script may build the fetched peer (the fetch library's rule), so
# give a built one in LLAMA_CPP_BIN. When scripts/device/run_all.sh runs your PEER_BUILD in the background, wait
# for it, up to LLAMA_WAIT seconds, after tandem's runs.
FAST_QUANT=1 bash "$here/models.sh" "$MODEL_DIR" "$TANDEM" "$SHAPE" >"$OUT/models.log" 2>&1 || tail -5 "$OUT/models.log"

for t in $TYPES; do
  f="$MODEL_DIR/$SHAPE-$t.gguf"
  [ -f "$f" ] || { echo "FAIL: no $f"; continue; }
  echo "--- $t: tandem"
  timeout 240 "$TANDEM" bench -m "$f" -p 512 -n 128 -b 1 -r "$REPS" -o md >"$OUT/tandem_$t.md" 2>&1
  echo "exit $?"; grep -E "^\||limits|commit" "$OUT/tandem_$t.md"
done

# Wait for the background build to end (run_all.sh marks its start in /tmp/peer_build.started and writes its exit
# status to /tmp/peer_build.rc), not only for the binary: a build still compiling the other tools would share the
# CPU with llama-bench's runs.
peer_building() { [ -f /tmp/peer_build.started ] && [ ! -f /tmp/peer_build.rc ]; }
waited=0
while { [ -z "$(find_lbench)" ] || peer_building; } && [ -n "${LLAMA_CPP_BIN:-}" ] &&
      [ $waited -lt "${LLAMA_WAIT:-120}" ]; do
  sleep 5; waited=$((waited + 5))
done
lbench=$(find_lbench)
[ -z "$lbench" ] && echo "no llama-bench (set LLAMA_CPP_BIN; waited ${waited}s): tandem only"
for t in $TYPES; do
  f="$MODEL_DIR/$SHAPE-$t.gguf"
  [ -f "$f" ] && [ -n "$lbench" ] || continue
  echo "--- $t: llama.cpp"
  timeout 240 "$lbench" -m "$f" -fa 1 -ngl 99 -p 512 -n 128 -r "$REPS" -o json >"$OUT/llama_$t.json" \
    2>"$OUT/llama_$t.err"
  echo "exit $?"; tail -2 "$OUT/llama_$t.err"
done

# One table. Bytes per token at tg: the file's tensor bytes minus the token embedding (read one row per token)
# are close to the weights read; tandem prints its own fraction, the same byte count is used for llama.cpp.
python3 - "$OUT" "$MODEL_DIR" "$SHAPE" $TYPES <<'EOF' | tee "$OUT/compare.md"
import json, os, re, sys
out, mdir, shape, types = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = []
for t in types:
    tan = {}
    bw = None
    try:
        for line in open(os.path.join(out, f"tandem_{t}.md")):
            m = re.match(r"limits: copy bandwidth ([0-9.]+) GB/s", line)
            if m: bw = float(m.group(1))
            m = re.match(r"\| (pp512|tg128) \| 1 \| ([0-9.]+) \| [0-9.]+ \| ([0-9.]+)%", line)
            if m: tan[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    except OSError:
        pass
    lc = {}
    try:
        for r in json.load(open(os.path.join(out, f"llama_{t}.json"))):
            test = "pp512" if r.get("n_prompt") == 512 and r.get("n_gen") == 0 else \
                   "tg128" if r.get("n_gen") == 128 and r.get("n_prompt") == 0 else None
            if test: lc[test] = float(r["avg_ts"])
    except (OSError, ValueError):
        pass
    for test in ("tg128", "pp512"):
        a = tan.get(test); b = lc.get(test)
        ratio = f"{a[0] / b:.2f}x" if a and b else "-"
        frac_t = f"{a[1]:.1f}%" if a else "-"
        # llama.cpp's fraction of the same limit: scale tandem's fraction by the t/s ratio.
        frac_l = f"{a[1] * b / a[0]:.1f}%" if a and b and a[0] > 0 else "-"
        rows.append((t, test, f"{a[0]:.1f}" if a else "-", f"{b:.1f}" if b else "-", ratio, frac_t, frac_l))
print(f"\n{shape}, batch 1, llama-bench -fa 1 -ngl 99 vs tandem bench (fraction: of the bandwidth at tg, "
      f"of the matmul rate at pp, as tandem bench computes it)\n")
print("| file | test | tandem t/s | llama.cpp t/s | tandem / llama.cpp | tandem fraction | llama.cpp fraction |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows: print("| " + " | ".join(r) + " |")
EOF
