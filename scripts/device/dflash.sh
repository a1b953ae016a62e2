#!/usr/bin/env bash
# Speculative decoding on the H200 (issue 18). Run from the repo root after build-gpu/ is built.
# env: BIN=build-gpu/bin, OUT=<results dir>. Budget: about 60 s.
#  1. tests/gpu/test_gpu_dflash.cpp: greedy speculative == plain greedy on cuda:0 (shipped small model +
#     shipped draft model, 4 sequences, draft-max 1/4/8), sampled run with rejections.
#  2. `tandem generate --draft` on cuda: ids equal plain generate's.
#  3. `tandem bench --draft` on cuda:0, draft-max 2/4/8: AR vs speculative tokens/s, speedup, acceptance.
# (The DFlash drafter itself is not built yet: no DFlash parity or device-feature bench here.)
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/dflash}
TESTS=${TESTS:-build-gpu/tests}
mkdir -p "$OUT"
fail=0
M=models/tandem-small-q8_0.gguf
D=models/tandem-draft-q8_0.gguf

if timeout 120 "$TESTS/tandem_gpu_tests" --gtest_filter='SpecGpu*' > "$OUT/gpu_tests.txt" 2>&1 \
  && ! grep -q "SKIPPED" "$OUT/gpu_tests.txt"; then
  echo "PASS gpu tests SpecGpu.*"
else
  echo "FAIL gpu tests SpecGpu.* (see $OUT/gpu_tests.txt)"; fail=1
fi
grep "cuda draft_max" "$OUT/gpu_tests.txt" || true

P='0,417,1210,4145;0,893'
timeout 60 "$BIN/tandem" generate -m $M --prompt-ids "$P" -n 64 --temp 0 --ids --devices cuda:0 > "$OUT/plain_ids.txt" 2>/dev/null
timeout 60 "$BIN/tandem" generate -m $M --prompt-ids "$P" -n 64 --temp 0 --ids --devices cuda:0 --draft $D --draft-max 4 \
  > "$OUT/spec_ids.txt" 2> "$OUT/spec_stderr.txt"
if [ -s "$OUT/plain_ids.txt" ] && cmp -s "$OUT/plain_ids.txt" "$OUT/spec_ids.txt"; then
  echo "PASS generate --draft ids == plain ids (cuda)"
else
  echo "FAIL generate --draft ids differ from plain (see $OUT/*_ids.txt)"; fail=1
fi

for n in 2 4 8; do
  if timeout 60 "$BIN/tandem" bench -m $M --draft $D --draft-max $n -p 0 -n 128 -b 1 -r 3 --device cuda:0 \
    > "$OUT/bench_draft_max_$n.md" 2>&1; then
    echo "bench draft-max $n: $(grep 'speedup over AR' "$OUT/bench_draft_max_$n.md")"
  else
    echo "FAIL bench --draft-max $n (see $OUT/bench_draft_max_$n.md)"; fail=1
  fi
done

if [ $fail -eq 0 ]; then echo "dflash.sh: PASS"; else echo "dflash.sh: FAIL"; fi
exit $fail
