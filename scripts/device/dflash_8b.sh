#!/usr/bin/env bash
# DFlash on a Qwen3-8B-shape target with random weights (issue 18, H200). Random weights cannot show
# acceptance (every draft is rejected, so every cycle verifies a full block), so this measures the costs that
# set the speedup: the draft pass, the verify pass per block size (draft-max + 1 rows, batch-invariant
# target), the AR step, and from them the speedup at each accepted length L (tokens per cycle):
#   speedup(L) = L x AR step / (draft pass + verify pass)
# plus the device-feature path against the host path (TANDEM_DFLASH_DEVICE_FEATURES=0) per cycle.
# Run after build-gpu/ (run_all.sh): TOPICS="dflash_8b:100" bash scripts/device/run_all.sh (needs only the CLI)
# env: BIN, OUT, MODELS (where the two random files go; default /dev/shm/tandem-8b, else /tmp); SHAPE=tiny
# DEVICE=cpu N_GEN=8 check the script on a CPU (bench/make_random_q8_gguf.py's width-64 shapes).
# Budget: DFLASH_8B_BUDGET (default 100 s): the files (~10-20 s, bench/make_random_q8_gguf.py), then benches
# while time is left (each ~10 s: loading 9 GB onto the GPU, AR and speculative runs); the table is printed.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/dflash_8b}
if [ -z "${MODELS:-}" ]; then
  if [ -d /dev/shm ] && [ "$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)" -gt 16 ]; then
    MODELS=/dev/shm/tandem-8b
  else
    MODELS=/tmp/tandem-8b
  fi
fi
mkdir -p "$OUT" "$MODELS"
fail=0
SHAPE=${SHAPE:-qwen3-8b}
DEVICE=${DEVICE:-cuda:0}
N_GEN=${N_GEN:-48}
BUDGET=${DFLASH_8B_BUDGET:-100}
T=$MODELS/$SHAPE-random-q8_0.gguf
F=$MODELS/$SHAPE-dflash-random-q8_0.gguf
t0=$SECONDS
for pair in "$SHAPE $T" "$SHAPE-dflash $F"; do
  set -- $pair
  [ -f "$2" ] && continue
  python3 bench/make_random_q8_gguf.py "$1" "$2" >> "$OUT/models.txt" 2>&1 || {
    echo "FAIL making $1 (see $OUT/models.txt)"; exit 1; }
done
echo "random $SHAPE target + drafter ready in $((SECONDS - t0)) s: $(cat "$OUT/models.txt" | tr '\n' ';')"

bench() {  # name, env, flags...
  local name=$1 envs=$2; shift 2
  if [ $((SECONDS - t0)) -gt $((BUDGET - 22)) ]; then echo "SKIP bench $name (budget)"; return; fi
  if env $envs timeout 30 "$BIN/tandem" bench -m "$T" "$@" -p 0 -n $N_GEN -b 1 -r 2 --device $DEVICE \
    > "$OUT/bench_$name.md" 2>&1; then
    echo "bench $name: $(grep 'time per verify cycle' "$OUT/bench_$name.md"); $(grep 'per cycle:' "$OUT/bench_$name.md")"
  else
    echo "FAIL bench $name (see $OUT/bench_$name.md)"; tail -3 "$OUT/bench_$name.md"; fail=1
  fi
}
bench dflash_block_16 "" --draft "$F" --draft-max 15
bench dflash_block_16_host "TANDEM_DFLASH_DEVICE_FEATURES=0" --draft "$F" --draft-max 15
for n in 7 3 1; do bench "dflash_block_$((n + 1))" "" --draft "$F" --draft-max $n; done
grep -h "target features" "$OUT"/bench_dflash_block_16*.md | sort | uniq

# The table: per block size, the draft and verify pass, the cycle, and the speedup at accepted lengths
# 1, 2, 4, 8 and the block size (L > block size is impossible).
{
  echo "| block (draft-max + 1) | draft pass ms | verify pass ms | cycle ms | AR step ms | speedup at L = 1 / 2 / 4 / 8 / block |"
  echo "|---|---|---|---|---|---|"
  for f in "$OUT"/bench_dflash_block_2.md "$OUT"/bench_dflash_block_4.md "$OUT"/bench_dflash_block_8.md \
           "$OUT"/bench_dflash_block_16.md "$OUT"/bench_dflash_block_16_host.md; do
    [ -f "$f" ] || continue
    b=$(basename "$f" .md); b=${b#bench_dflash_block_}
    awk -v b="$b" '
      /^time per verify cycle:/ { cyc = $5; ar = $(NF - 4) }
      /^per cycle: draft pass/ { dr = $5; vf = $9 }
      END {
        if (cyc == "" || ar == "") exit 1
        n = b; sub(/_host/, "", n); n += 0
        s = ""; for (L = 1; L <= 8 && L <= n; L *= 2) s = s sprintf("%.2fx / ", L * ar / cyc)
        s = s sprintf("%.2fx", n * ar / cyc)
        printf "| %s | %s | %s | %s | %s | %s |\n", b, dr, vf, cyc, ar, s
      }' "$f" || { echo "FAIL parsing $f"; fail=1; }
  done
} | tee "$OUT/table.md"
if [ -f "$OUT/bench_dflash_block_16.md" ] && [ -f "$OUT/bench_dflash_block_16_host.md" ]; then
  dev=$(awk '/^time per verify cycle:/ { print $5 }' "$OUT/bench_dflash_block_16.md")
  host=$(awk '/^time per verify cycle:/ { print $5 }' "$OUT/bench_dflash_block_16_host.md")
  awk -v d="$dev" -v h="$host" 'BEGIN { if (d > 0) printf "device-feature path vs host path, block 16: %.3f ms vs %.3f ms per cycle (host %.1f%% slower)\n", d, h, 100 * (h - d) / d }' | tee -a "$OUT/table.md"
fi
rm -rf "$MODELS"
if [ $fail -eq 0 ]; then echo "dflash_8b.sh: PASS"; else echo "dflash_8b.sh: FAIL"; fi
exit $fail
