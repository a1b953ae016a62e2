#!/usr/bin/env bash
# Speculative decoding on the H200 (issue 18). Run from the repo root after build-gpu/ is built
# (run_all.sh does both): TOPICS="dflash:200" bash scripts/device/run_all.sh
# env: BIN=build-gpu/bin, TESTS=build-gpu/tests, OUT=<results dir>, FINAL_OUT (run_all.sh's returned folder:
# the trained drafter is copied there, a file of its own), DFLASH_BUDGET (seconds, default 200),
# DFLASH_GPU_TESTS=0 / DFLASH_PARITY=0 skip steps 1 / 2 (when the full GPU test binary runs beside this).
#  1. tests/gpu/test_gpu_dflash.cpp: SpecGpu.* (draft model: greedy == plain greedy, batch-invariant target)
#     and DflashGpu.* (device-feature path bit-identical to the host path; greedy DFlash == plain greedy).
#  2. tests/reference/dflash_parity.py: tandem's dflash forward vs the PyTorch reimplementation of z-lab's
#     drafter, random weights, same features: max rel error < 1e-3 (cuda and cpu).
#  3. models/training/train_dflash.py (only when models/tandem-small-dflash-q8_0.gguf is absent): trains the
#     small drafter on the target's own greedy continuations of real-text and sampled prompts; the file goes
#     to $FINAL_OUT/tandem-small-dflash-q8_0.gguf (and $OUT/train/); then the shipped-drafter tests run with
#     it (DflashShipped.* and the sampled chi-square test on the CPU, DflashGpu.ShippedDrafterAcceptsOnCuda),
#     through TANDEM_DFLASH_DRAFTER.
#  4. `tandem generate --draft DFLASH` on cuda: ids equal plain generate's; acceptance printed.
#  5. `tandem bench --draft` (draft model and DFlash) on cuda:0: AR vs speculative tokens/s, speedup,
#     acceptance, draft / verify pass time per cycle; DFlash with device features vs the host path.
# Every number that matters is printed to stdout (the topic's folder may not come back).
# The Qwen3-8B-shape random-weight bench is scripts/device/dflash_8b.sh.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/dflash}
TESTS=${TESTS:-build-gpu/tests}
mkdir -p "$OUT"
fail=0
M=models/tandem-small-q8_0.gguf
D=models/tandem-draft-q8_0.gguf
F=models/tandem-small-dflash-q8_0.gguf
t_start=$SECONDS
BUDGET=${DFLASH_BUDGET:-200}

if [ "${DFLASH_GPU_TESTS:-1}" = 1 ]; then
if timeout 120 "$TESTS/tandem_gpu_tests" --gtest_filter='SpecGpu*:DflashGpu*' > "$OUT/gpu_tests.txt" 2>&1 \
  && ! grep -q "SKIPPED.*no CUDA" "$OUT/gpu_tests.txt"; then
  echo "PASS gpu tests SpecGpu.* DflashGpu.*"
else
  echo "FAIL gpu tests SpecGpu.* DflashGpu.* (see $OUT/gpu_tests.txt)"; fail=1
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$OUT/gpu_tests.txt" | head -20
fi
grep -E "cuda (dflash|draft model) draft_max|cuda shipped dflash|dflash:" "$OUT/gpu_tests.txt" | head -20 || true
fi

if [ "${DFLASH_PARITY:-1}" = 1 ]; then
if timeout 60 python3 tests/reference/dflash_parity.py --tests "$TESTS/tandem_gpu_tests" --work /tmp/dflash_parity \
  > "$OUT/parity.txt" 2>&1; then
  grep -E "^(PASS|FAIL)" "$OUT/parity.txt"
else
  grep -E "^(PASS|FAIL)" "$OUT/parity.txt" || tail -5 "$OUT/parity.txt"
  echo "FAIL dflash parity (see $OUT/parity.txt)"; fail=1
fi
fi

if [ ! -f "$F" ]; then
  # Prompts of real text for the drafter's training data: the ids of models/eval/heldout_eval.txt (the script
  # keeps the last 15% for its held-out evaluation).
  "$BIN/tandem" tokenize -m $M -f models/eval/heldout_eval.txt --ids --no-bos > "$OUT/text_ids.txt" 2>/dev/null
  left=$((BUDGET - (SECONDS - t_start) - 65))
  [ $left -gt 150 ] && left=150
  if [ $left -gt 40 ] && timeout $((left + 40)) python3 models/training/train_dflash.py --target $M --out "$OUT/train" \
    --text-ids "$OUT/text_ids.txt" --deadline-s $left > "$OUT/train_log.txt" 2>&1 \
    && [ -f "$OUT/train/tandem-small-dflash-q8_0.gguf" ]; then
    F="$OUT/train/tandem-small-dflash-q8_0.gguf"
    [ -n "${FINAL_OUT:-}" ] && cp "$F" "$FINAL_OUT/tandem-small-dflash-q8_0.gguf" && cp "$OUT/train/train_dflash.json" "$FINAL_OUT/"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('train_dflash:', json.dumps({k: r[k] for k in ('steps','final_loss','teacher_forced_mean_accepted_length','per_slot_acceptance','ci_prompts_teacher_forced_mean_accepted_length','ci_prompts_per_slot','train_sequences_teacher_forced_mean_accepted_length','seconds')}))" "$OUT/train/train_dflash.json"
    echo "PASS trained the DFlash drafter ($(grep -oE '"(ci_prompts_)?teacher_forced_mean_accepted_length": [0-9.]*' "$OUT/train_log.txt" | tr '\n' ' '))"
  else
    echo "FAIL training the DFlash drafter (see $OUT/train_log.txt)"; fail=1; tail -5 "$OUT/train_log.txt"
  fi
fi
if [ -f "$F" ]; then
  # The shipped-drafter tests with this file: CPU (what CI checks once it is in models/) and cuda.
  if TANDEM_DFLASH_DRAFTER="$F" timeout 90 "$TESTS/tandem_tests" \
       --gtest_filter='DflashShipped.*:Dflash.SampledOutputFollowsTargetOnShippedModel' > "$OUT/shipped_cpu.txt" 2>&1 \
     && TANDEM_DFLASH_DRAFTER="$F" timeout 60 "$TESTS/tandem_gpu_tests" \
       --gtest_filter='DflashGpu.ShippedDrafterAcceptsOnCuda' > "$OUT/shipped_gpu.txt" 2>&1; then
    echo "PASS shipped-drafter tests (CPU and cuda)"
  else
    echo "FAIL shipped-drafter tests (see $OUT/shipped_cpu.txt, shipped_gpu.txt)"; fail=1
  fi
  grep -hE "shipped dflash|teacher-forced|chi-square|Failure|Expected|actual" "$OUT/shipped_cpu.txt" "$OUT/shipped_gpu.txt" | head -20
fi

P='0,417,1210,4145;0,893'
timeout 60 "$BIN/tandem" generate -m $M --prompt-ids "$P" -n 64 --temp 0 --ids --devices cuda:0 > "$OUT/plain_ids.txt" 2>/dev/null
if [ -f "$F" ]; then
  timeout 60 "$BIN/tandem" generate -m $M --prompt-ids "$P" -n 64 --temp 0 --ids --devices cuda:0 --draft "$F" \
    --draft-max 7 > "$OUT/dflash_ids.txt" 2> "$OUT/dflash_stderr.txt"
  if [ -s "$OUT/plain_ids.txt" ] && cmp -s "$OUT/plain_ids.txt" "$OUT/dflash_ids.txt"; then
    echo "PASS generate --draft DFLASH ids == plain ids (cuda); $(grep -o 'mean accepted length [0-9.]*' "$OUT/dflash_stderr.txt")"
  else
    echo "FAIL generate --draft DFLASH ids differ from plain (see $OUT/*_ids.txt, dflash_stderr.txt)"; fail=1
  fi
fi

bench() {  # name, extra env, flags...
  local name=$1 envs=$2; shift 2
  if env $envs timeout 40 "$BIN/tandem" bench -m $M "$@" -p 0 -n 128 -b 1 -r 2 --device cuda:0 > "$OUT/bench_$name.md" 2>&1; then
    echo "bench $name: $(grep 'speedup over AR' "$OUT/bench_$name.md"); $(grep 'per cycle:' "$OUT/bench_$name.md")"
  else
    echo "FAIL bench $name (see $OUT/bench_$name.md)"; fail=1
  fi
}
bench draft_max_4 "" --draft $D --draft-max 4
if [ -f "$F" ]; then
  for n in 3 7; do bench "dflash_max_$n" "" --draft "$F" --draft-max $n; done
  bench dflash_max_7_host "TANDEM_DFLASH_DEVICE_FEATURES=0" --draft "$F" --draft-max 7
  grep "time per verify cycle" "$OUT/bench_dflash_max_7.md" "$OUT/bench_dflash_max_7_host.md" 2>/dev/null
fi

if [ $fail -eq 0 ]; then echo "dflash.sh: PASS"; else echo "dflash.sh: FAIL"; fi
exit $fail
