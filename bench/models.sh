#!/usr/bin/env bash
# Makes random-weight GGUF files of the real Qwen3-0.6B and Qwen3-8B shapes for `tandem bench`, on a bare GPU
# machine: transformers' random initialisation saved as bf16 safetensors (bench/make_random_model.py), then
# `tandem convert` (bf16 GGUF) and `tandem quantize` (q8_0, q4_k).
#
# usage: bench/models.sh OUT_DIR [TANDEM_BIN] [SHAPES]   (SHAPES default: "qwen3-0.6b qwen3-8b")
# Writes OUT_DIR/<shape>-{bf16,q8_0,q4_k}.gguf; skips files that exist. The safetensors are deleted after
# conversion (the 8B checkpoint is 16 GB).
#
# FAST_QUANT=1: make the q8_0 / q4_k files with `tandem bench --random-weights` (random valid blocks, seconds)
# instead of `tandem quantize` (its scale searches run at ~2-4 M weights/s per thread: several minutes for 8B
# even on 16 cores). Speed does not depend on the weights' values; BENCHMARKS.md says which way each file was made.
set -euo pipefail
out=${1:?usage: bench/models.sh OUT_DIR [TANDEM_BIN] [SHAPES]}
tandem=${2:-build-gpu/bin/tandem}
shapes=${3:-"qwen3-0.6b qwen3-8b"}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for shape in $shapes; do
  bf16="$out/$shape-bf16.gguf"
  if [ ! -f "$bf16" ]; then
    hf="$out/$shape-hf"
    t0=$(date +%s)
    PYTHONUNBUFFERED=1 python3 "$here/make_random_model.py" "$shape" "$hf"
    t1=$(date +%s)
    "$tandem" convert "$hf" -o "$bf16" --type bf16 --quiet
    t2=$(date +%s)
    rm -rf "$hf"
    echo "$shape: random init + safetensors $((t1 - t0)) s, convert $((t2 - t1)) s"
  fi
  for q in q8_0 q4_k; do
    f="$out/$shape-$q.gguf"
    if [ ! -f "$f" ]; then
      t0=$(date +%s)
      if [ "${FAST_QUANT:-0}" = 1 ]; then
        "$tandem" bench -m "$bf16" --random-weights "$q" --to "$f"
        echo "$shape: random $q weights $(( $(date +%s) - t0 )) s"
      else
        "$tandem" quantize "$bf16" "$f" "$q" --quiet
        echo "$shape: quantize $q $(( $(date +%s) - t0 )) s"
      fi
    fi
  done
done
ls -la "$out"
