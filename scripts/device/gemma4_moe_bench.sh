#!/usr/bin/env bash
# gemma4 26B-A4B speed on the H200 (issue 16): random-weight GGUFs of the 26B-A4B shape (LAYERS of its layers,
# default 12: 128 experts of n_ff 704, top 8, beside the dense MLP; scripts/device/gemma4_moe_template.py, then
# `tandem bench --random-weights` for bf16 and q4_k_m) and `tandem bench` tg128 at batch 1 and pp512 on cuda:0.
# tandem's report prints the weights a batch-1 decode step reads (the used experts only: 8/128 of every expert
# tensor, plus everything else) and the tg fraction of 4.28 TB/s (--bw 4280) computed on those bytes. When
# LLAMA_CPP_BIN has llama-bench (run_all.sh builds it with PEER=1), the same files run there too (-ngl 99
# -fa 1), for the side-by-side rows of bench/BENCHMARKS.md.
# Note: q4_k_m here is tandem quantize's mix; tensors whose row length is not a multiple of 256 (ffn_down_exps
# 704, ffn_down 2112) fall back to q8_0, as `tandem quantize` does. Both engines read the same file.
# Usage: BIN=build-gpu/bin OUT=<dir> [LAYERS=12] scripts/device/gemma4_moe_bench.sh. Budget: about 240 s
# (writing bf16 ~20 GB and q4_k_m ~6 GB of random weights ~60 s, each bench ~40 s, llama-bench ~40 s each).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/gemma4_moe_bench_out}
LAYERS=${LAYERS:-12}
mkdir -p "$OUT"
status=0
TMPL=/tmp/gemma4_26b_a4b_template.gguf
python3 scripts/device/gemma4_moe_template.py "$TMPL" --layers "$LAYERS" || { echo "FAIL template"; exit 1; }
for t in q4_k_m bf16; do
  f=/tmp/gemma4_26b_a4b_$t.gguf
  t0=$SECONDS
  if ! "$BIN/tandem" bench -m "$TMPL" --random-weights "$t" --to "$f" >"$OUT/make_$t.txt" 2>&1; then
    echo "FAIL make_$t"; tail -5 "$OUT/make_$t.txt"; status=1; continue
  fi
  echo "made $f ($(du -h "$f" | cut -f1)) in $((SECONDS - t0)) s"
  t0=$SECONDS
  if timeout 150 "$BIN/tandem" bench -m "$f" -p 512 -n 128 -b 1 -r 2 --device cuda:0 --bw 4280 \
      >"$OUT/bench_$t.txt" 2>&1; then
    echo "PASS bench_$t ($((SECONDS - t0)) s)"
  else
    echo "FAIL bench_$t ($((SECONDS - t0)) s)"; status=1
  fi
  grep -E "model:|shape:|decode step reads|limits:|^\| (pp|tg)" "$OUT/bench_$t.txt"
  tail -3 "$OUT/bench_$t.txt" | grep -iE "error|fail" && status=1
  if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-bench" ]; then
    t0=$SECONDS
    timeout 120 "$LLAMA_CPP_BIN/llama-bench" -m "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 >"$OUT/llama_bench_$t.txt" 2>&1
    echo "llama-bench $t rc=$? ($((SECONDS - t0)) s):"
    grep -E "^\|" "$OUT/llama_bench_$t.txt" | tail -4
  else
    echo "llama-bench: LLAMA_CPP_BIN not set or no llama-bench there (run_all.sh PEER=1 builds it)"
  fi
  rm -f "$f"
done
rm -f "$TMPL"
echo "gemma4_moe_bench device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
