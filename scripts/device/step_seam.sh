#!/usr/bin/env bash
# The step seam's split modes on the one GPU (issue 14, item 8): the GPU split/step/comm tests (two ranks
# sharing cuda:0: the tensor split through the copy comm), then `tandem bench` of a random Qwen3-0.6B-shape bf16
# model for every split mode over cuda:0,cuda:0 with CUDA graphs on and off (TANDEM_NO_GRAPHS=1 is how split
# models ran before: tensor and row splits never recorded). Run by scripts/device/run_all.sh (BIN, OUT set).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/step_seam}; mkdir -p "$OUT"
MODEL_DIR=${MODEL_DIR:-/tmp/tandem-models}
"$BIN/tandem_gpu_tests" --gtest_filter='GpuSplit*:CommGpu*:GpuComm*:*StepApi*' 2>&1 | tee "$OUT/split_tests.log" |
  grep -E "^\[ split|graph replays|OK \]|FAILED|PASSED|Failure|error" | tail -40
bash bench/models.sh "$MODEL_DIR" "$BIN/tandem" qwen3-0.6b >"$OUT/models.log" 2>&1 || tail -5 "$OUT/models.log"
f="$MODEL_DIR/qwen3-0.6b-bf16.gguf"
[ -f "$f" ] || { echo "FAIL: no $f"; exit 1; }
for mode in none tensor layer row; do
  for graphs in on off; do
    env=""; [ $graphs = off ] && env="TANDEM_NO_GRAPHS=1"
    echo "--- --split-mode $mode, graphs $graphs"
    env $env timeout 90 "$BIN/tandem" bench -m "$f" --devices cuda:0,cuda:0 --split-mode "$mode" -p 512 -n 64 \
      -b 1 -r 2 -o md >"$OUT/bench_${mode}_$graphs.log" 2>&1
    echo "exit $?"; grep -E "^\|" "$OUT/bench_${mode}_$graphs.log" | tee -a "$OUT/split_bench.md"
    grep -iE "error|warning" "$OUT/bench_${mode}_$graphs.log" | head -3
  done
done
