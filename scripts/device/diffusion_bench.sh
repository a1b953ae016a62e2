#!/usr/bin/env bash
# Canvas diffusion speed on the H200 (issue 17): `tandem bench --diffusion` on a random-weight diffusion-gemma
# file, bf16 and q4_k, canvas from the file, prompt 128: PREFILL ms, ms per denoising step (forward + SC +
# sampling; 8 steps measured) and tokens/s at the default steps, host vs device sampling path.
#   BIN=build-gpu/bin OUT=<dir> [DGM_GGUF=<file.gguf>] scripts/device/diffusion_bench.sh
# The model file: $DGM_GGUF, else the first of the paths below that exists (the model side's parity run writes
# its 26B-A4B-shaped file there). Prints SKIP (exit 0) when `tandem diffuse` reports the model side missing or
# no file is found. Budget: about 150 s (180 s given).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/diffusion_bench_out}
mkdir -p "$OUT"

probe=$("$BIN/tandem" diffuse -m models/tandem-small-q8_0.gguf -p hi -n 1 2>&1)
if echo "$probe" | grep -q "not supported yet"; then
  echo "SKIP diffusion_bench: the diffusion-gemma model side is not in this build ($(echo "$probe" | tail -1))"
  exit 0
fi

SRC=${DGM_GGUF:-}
if [ -z "$SRC" ]; then
  for f in /tmp/diffusion_gemma_work/*26b*.gguf /tmp/diffusion_gemma_work/*.gguf /tmp/dgm_parity_work/*/*.gguf \
           tests/data/models/diffusion_gemma*.gguf; do
    if [ -f "$f" ]; then SRC=$f; break; fi
  done
fi
if [ -z "$SRC" ] || [ ! -f "$SRC" ]; then
  echo "SKIP diffusion_bench: no diffusion-gemma GGUF found (set DGM_GGUF to one)"
  exit 0
fi
echo "model: $SRC"
status=0
for t in bf16 q4_k; do
  dst=/tmp/diffusion_bench_$t.gguf
  if ! timeout 120 "$BIN/tandem" bench -m "$SRC" --random-weights $t --to "$dst" >"$OUT/random_$t.txt" 2>&1; then
    echo "FAIL random-weight $t copy (see $OUT/random_$t.txt)"; tail -5 "$OUT/random_$t.txt"; status=1; continue
  fi
  if timeout 150 "$BIN/tandem" bench -m "$dst" --diffusion -p 128 --diffusion-steps 8 -r 2 >"$OUT/bench_$t.md" 2>&1; then
    echo "PASS bench --diffusion $t"
    grep -E "^\| (host|device)|speedup|did not run" "$OUT/bench_$t.md"
  else
    echo "FAIL bench --diffusion $t (see $OUT/bench_$t.md)"; tail -10 "$OUT/bench_$t.md"; status=1
  fi
  rm -f "$dst"
done
if [ $status -eq 0 ]; then echo "diffusion_bench.sh: PASS"; else echo "diffusion_bench.sh: FAIL"; fi
exit $status
