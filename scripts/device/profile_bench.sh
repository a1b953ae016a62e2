#!/usr/bin/env bash
# Where a decode step's time goes (issue 19), on the GPU machine after run_all.sh built tandem (BIN, OUT set)
# and made the Qwen3-8B-shape files (PREP_MODELS=1): the profiler's GPU test, then `tandem bench --profile`
# (src/backend/kernel_profile.h: CUPTI kernel records of one more tg run) for each file, batch 1, tg64, once with
# the defaults and once with each switch of PROFILE_SWITCHES (e.g. "TANDEM_PDL=1"): the kernels by time per step,
# the time a kernel runs and the time none does. Profiled steps are slower than plain ones (CUPTI's records);
# the tokens/s rows of the same command are printed beside for that reason. PROFILE_SWITCH_TYPES limits the
# switch runs to some files; KERNELS=1 then times the kernels alone (`tandem bench --kernels`, the whole table).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/profile_bench}; mkdir -p "$OUT"
MODEL_DIR=${MODEL_DIR:-/dev/shm/tandem-models}
if [ -x "$BIN/tandem_gpu_tests" ]; then
  "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter='GpuKernelProfile*' >"$OUT/gpu_test.log" 2>&1
  echo "GpuKernelProfile rc=$?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|Expected|Which is|why" "$OUT/gpu_test.log" | head -12
fi
for t in ${PROFILE_TYPES:-q8_0 q4_k bf16}; do
  f=$MODEL_DIR/qwen3-8b-$t.gguf
  [ -f "$f" ] || { echo "no $f"; continue; }
  sws=default
  case " ${PROFILE_SWITCH_TYPES:-$t} " in *" $t "*) sws="default ${PROFILE_SWITCHES:-}" ;; esac
  for sw in $sws; do
    tag=$t${sw/default/}; tag=${tag//=/}
    if [ "$sw" = default ]; then envs=(); else envs=("$sw"); fi
    env "${envs[@]}" timeout 90 "$BIN/tandem" bench -m "$f" -p 0 -n ${PROFILE_N:-64} -b 1 -r 2 --profile -o md \
      >"$OUT/profile_$tag.md" 2>"$OUT/profile_$tag.log"
    echo "=== $t $sw: rc=$?"
    grep -E "^\| tg" "$OUT/profile_$tag.md"
    grep -A${PROFILE_ROWS:-24} -E "^## Kernels of" "$OUT/profile_$tag.md" | grep -v "^$"
    tail -2 "$OUT/profile_$tag.log" | grep -iE "error|fail"
  done
done
if [ "${KERNELS:-0}" = 1 ]; then
  timeout 150 "$BIN/tandem" bench --kernels -o md >"$OUT/kernels.md" 2>&1
  echo "=== kernels alone (bench --kernels): rc=$?"
  grep -E "^\| (matmul|attention)" "$OUT/kernels.md" | grep -E "T=1 |T=8 |attention" | head -40
  tail -2 "$OUT/kernels.md" | grep -iE "error"
fi
