#!/usr/bin/env bash
# Canvas diffusion speed on the H200 (issue 17): the DiffusionGemma 26B-A4B shape with LAYERS of its 30 layers
# (default 6, to fit the budget: scripts/device/diffusion_gemma_template.py, then `tandem bench
# --random-weights` bf16 and q4_k_m), canvas 256, prompt 128, `tandem bench --diffusion` on cuda:0: PREFILL ms,
# ms per denoising step (DECODE + SC + sampling; STEPS steps measured, stop rule off), tokens/s of one canvas at
# the default 48 steps, bytes per step against 4280 GB/s, for the host path (the whole canvas's logits cross to
# the host and are reduced there) and the GPU path (SC and the EB reduction on the GPU, 3 numbers per row back).
# With SLOPE_LAYERS set (e.g. 3), bf16 also runs at that many layers: the per-layer cost from the two points
# gives the 30-layer estimate (printed). A layer count other than 30 is a measurement of fewer layers: say so.
# KV_AB="f16 f16:TANDEM_FLASH_HD512=1": one more bench per entry, --diffusion-kv-type VALUE with the environment
# switches after the colon (comma-separated) set; the default row is auto (f32 unless TANDEM_CANVAS_KV_F16=1).
# PROFILE=1 adds `--profile`: the per-kernel table of the GPU path's denoising steps (tandem bench --profile).
# Usage: BIN=build-gpu/bin OUT=<dir> [LAYERS=6] [SLOPE_LAYERS=] [STEPS=8] [PROFILE=1] [DIFF_TYPES="bf16 q4_k_m"]
#        scripts/device/diffusion_bench.sh
# Budget: 45 s at 6 layers on the H200 (call B, 2026-12-04: random bf16 11 GB in 9 s, q4_k_m 3.9 GB in 3 s, each
# bench ~16 s incl. load and the SC table); give 90 s (SLOPE_LAYERS adds ~20 s); each part has a timeout.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/diffusion_bench_out}
LAYERS=${LAYERS:-6}
SLOPE_LAYERS=${SLOPE_LAYERS:-}
STEPS=${STEPS:-8}
BW=${BW:-4280}
mkdir -p "$OUT"
status=0
declare -A STEP_MS

run_one() {  # type layers
  local t=$1 L=$2
  local tmpl=/tmp/dgm_bench_template_$L.gguf f=/tmp/dgm_bench_${t}_$L.gguf t0=$SECONDS
  if [ ! -f "$tmpl" ]; then
    python3 scripts/device/diffusion_gemma_template.py "$tmpl" --layers "$L" --canvas 256 >"$OUT/template_$L.txt" 2>&1 ||
      { echo "FAIL template ($L layers)"; cat "$OUT/template_$L.txt"; status=1; return; }
  fi
  if ! timeout 90 "$BIN/tandem" bench -m "$tmpl" --random-weights "$t" --to "$f" >"$OUT/make_${t}_$L.txt" 2>&1; then
    echo "FAIL random-weight $t copy, $L layers (see $OUT/make_${t}_$L.txt)"; tail -5 "$OUT/make_${t}_$L.txt"
    status=1; rm -f "$f"; return
  fi
  echo "made $f ($(du -h --apparent-size "$f" | cut -f1)) in $((SECONDS - t0)) s"
  t0=$SECONDS
  if timeout 100 "$BIN/tandem" bench -m "$f" --diffusion -p 128 --diffusion-steps "$STEPS" -r 2 --device cuda:0 \
      --bw "$BW" ${PROFILE:+--profile} >"$OUT/bench_${t}_$L.md" 2>"$OUT/bench_${t}_$L.log"; then
    echo "PASS bench --diffusion $t, $L layers ($((SECONDS - t0)) s)"
    grep -E "^\| (host|device)|speedup|did not run|bytes per step" "$OUT/bench_${t}_$L.md"
    [ -n "${PROFILE:-}" ] && grep -A14 -E "^## Kernels of" "$OUT/bench_${t}_$L.md"
    STEP_MS[$t.$L]=$(grep -E "^\| device reduction \| device" "$OUT/bench_${t}_$L.md" | awk -F'|' '{print $5}' | tr -d ' ')
  else
    echo "FAIL bench --diffusion $t, $L layers ($((SECONDS - t0)) s; see $OUT/bench_${t}_$L.*)"
    tail -10 "$OUT/bench_${t}_$L.md" "$OUT/bench_${t}_$L.log"; status=1
  fi
  for spec in ${KV_AB:-}; do  # the same file with another K/V store precision (--diffusion-kv-type), beside
    local kv=${spec%%:*} envs="" name=${spec//[:=,]/_}
    [ "$kv" != "$spec" ] && envs=${spec#*:}
    env ${envs//,/ } timeout 100 "$BIN/tandem" bench -m "$f" --diffusion -p 128 --diffusion-steps "$STEPS" -r 2 \
      --device cuda:0 --bw "$BW" --diffusion-kv-type "$kv" >"$OUT/bench_${t}_${L}_kv_$name.md" 2>&1
    echo "--diffusion-kv-type $kv ${envs} rc=$?:"; grep -E "^source:|^\| (host|device)" "$OUT/bench_${t}_${L}_kv_$name.md"
  done
  rm -f "$f"
}

for t in ${DIFF_TYPES:-bf16 q4_k_m}; do run_one "$t" "$LAYERS"; done
if [ -n "$SLOPE_LAYERS" ] && [ "$SLOPE_LAYERS" != "$LAYERS" ]; then
  run_one bf16 "$SLOPE_LAYERS"
  a=${STEP_MS[bf16.$SLOPE_LAYERS]:-} b=${STEP_MS[bf16.$LAYERS]:-}
  if [ -n "$a" ] && [ -n "$b" ]; then
    python3 -c "
a, b, la, lb = $a, $b, $SLOPE_LAYERS, $LAYERS
per = (b - a) / (lb - la); base = b - per * lb
print(f'bf16 GPU path: {per:.3f} ms per layer + {base:.3f} ms outside the layers (head, SC, reduction) '
      f'-> estimate for 30 layers: {base + 30 * per:.2f} ms per step')" | tee "$OUT/estimate_30_layers.txt"
  fi
fi
rm -f /tmp/dgm_bench_template_*.gguf
if [ $status -eq 0 ]; then echo "diffusion_bench.sh: PASS"; else echo "diffusion_bench.sh: FAIL"; fi
exit $status
