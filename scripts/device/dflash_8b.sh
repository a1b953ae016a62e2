#!/usr/bin/env bash
# DFlash on a Qwen3-8B-shape target with random weights (issue 18, H200): random weights cannot show
# acceptance, so this measures the costs that set the speedup: the draft pass, the verify pass per block size
# (draft-max + 1 rows, batch-invariant target), the AR step, and from them the speedup at each accepted length
# L = AR step time x L / cycle time. Also the device-feature path vs the host path per cycle.
# Run after build-gpu/ (run_all.sh): TOPICS="dflash_8b:420" bash scripts/device/run_all.sh
# env: BIN, OUT, MODELS (where the 8B files are made or found; default /tmp/tandem-models).
# Budget: about 420 s on a bare machine (random 8B checkpoint + convert ~200 s, benches ~150 s).
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/dflash_8b}
MODELS=${MODELS:-/tmp/tandem-models}
mkdir -p "$OUT" "$MODELS"
fail=0
FAST_QUANT=1 bash bench/models.sh "$MODELS" "$BIN/tandem" qwen3-8b > "$OUT/models.txt" 2>&1 || {
  echo "FAIL making the qwen3-8b model (see $OUT/models.txt)"; exit 1; }
T=$MODELS/qwen3-8b-q8_0.gguf
# A random drafter of the 8B width: 2 layers, taps of 5 layers (HF ids 1, 9, 17, 25, 33 + 1), block 16.
python3 - "$MODELS/qwen3-8b-dflash-random.gguf" <<'EOF' > "$OUT/drafter.txt" 2>&1 || { echo "FAIL drafter"; exit 1; }
import sys, os, torch
sys.path.insert(0, "models/training")
import dflash_torch as dt
c = {"hidden_size": 4096, "layers": 2, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 12288,
     "rms_eps": 1e-6, "rope_theta": 1000000.0, "n_taps": 5}
d = dt.DFlashDraft(c)
with torch.no_grad():
    for p in d.parameters():
        if p.dim() == 2: p.normal_(0, 0.02)
meta = dt.drafter_gguf_meta(c, [2, 10, 18, 26, 34], 16, 151643, 40960, "qwen3-8b-dflash-random")
dt.write_gguf(sys.argv[1], meta, dt.drafter_gguf_tensors(d))
print("wrote", sys.argv[1], os.path.getsize(sys.argv[1]))
EOF
F=$MODELS/qwen3-8b-dflash-random.gguf
bench() {  # name, env, flags...
  local name=$1 envs=$2; shift 2
  if env $envs timeout 60 "$BIN/tandem" bench -m $T "$@" -p 0 -n 96 -b 1 -r 2 --device cuda:0 > "$OUT/bench_$name.md" 2>&1; then
    echo "bench $name: $(grep 'time per verify cycle' "$OUT/bench_$name.md"); $(grep 'per cycle:' "$OUT/bench_$name.md")"
  else
    echo "FAIL bench $name (see $OUT/bench_$name.md)"; fail=1
  fi
}
for n in 3 7 15; do bench "dflash_block_$((n + 1))" "" --draft "$F" --draft-max $n; done
bench dflash_block_16_host "TANDEM_DFLASH_DEVICE_FEATURES=0" --draft "$F" --draft-max 15
# Speedup at accepted length L (tokens per cycle) = L x AR step / cycle time, for each block size.
for n in 3 7 15; do
  f="$OUT/bench_dflash_block_$((n + 1)).md"
  [ -f "$f" ] || continue
  awk -v n=$n '/time per verify cycle/ { for (i = 1; i <= NF; ++i) { if ($i == "ms" && c == "") c = $(i-1); if ($i == "per" && $(i+1) == "AR") a = $(i-2) } }
       END { if (c > 0) { printf "block %d: cycle %.2f ms, AR step %.2f ms; speedup at L=", n + 1, c, a;
             for (L = 1; L <= n + 1; L *= 2) printf " %d: %.2fx", L, L * a / c; printf " %d: %.2fx\n", n + 1, (n + 1) * a / c } }' "$f"
done
if [ $fail -eq 0 ]; then echo "dflash_8b.sh: PASS"; else echo "dflash_8b.sh: FAIL"; fi
exit $fail
