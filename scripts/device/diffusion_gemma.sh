#!/usr/bin/env bash
# diffusion-gemma on the H200 (issue 17, model side). Run from the repo root after run_all.sh built tandem:
#   BIN=build-gpu/bin TESTS=build-gpu/tests OUT=<dir> [DG_BIG=1] bash scripts/device/diffusion_gemma.sh
# 1. the GPU tests (tests/gpu/test_gpu_diffusion_gemma.cpp: cuda vs cpu and the double reference, layer and
#    tensor split with 2 ranks sharing cuda:0, SC buffers on the first rank; the committed transformers fixture
#    on cuda), also under TANDEM_NO_FUSED=1 and TANDEM_PDL=1 (the kernel variants other topics run), and the
#    CPU diffusion tests; the per-step errors are printed;
# 2. tests/reference/diffusion_gemma_parity.py: transformers' DiffusionGemmaForBlockDiffusion on random weights
#    (tiny, small; with DG_BIG=1 also the 26B-A4B shape with 2 layers), saved, `tandem convert`ed, canvas
#    logits of 3 steps compared (UNIFIED and PREFILL+DECODE, host and device SC; each step given transformers'
#    previous logits for self-conditioning, so every step compares alone; the chain of own logits printed) on
#    cpu, cuda, layer, tensor within 1e-3: one line per spec and placement. The tiny spec's fixture is packed
#    into ${FINAL_OUT:-$OUT}/dgm_fixture.tar.gz as soon as it exists (for tests/data/models/). The parity
#    stops after DG_PARITY_BUDGET seconds (default 200).
# Prints everything that matters to stdout, PASS/FAIL per part. Budget: ~120 s (GPU tests ~10 s, CPU ~5 s,
# parity tiny + small ~40 s); DG_BIG=1 adds ~120 s (the 26B spec runs last, so a short budget cuts only it).
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
TESTS=${TESTS:-build-gpu/tests}
OUT=${OUT:-/tmp/diffusion_gemma_out}
RET=${FINAL_OUT:-$OUT}
mkdir -p "$OUT" "$RET"
status=0
gpu_part() {  # name, env assignment...: the GPU tests, their per-step lines
  local name=$1
  shift
  local t0=$SECONDS
  if env "$@" timeout 120 "$TESTS/tandem_gpu_tests" --gtest_filter='GpuDiffusionGemma*' >"$OUT/$name.txt" 2>&1; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL $name ($((SECONDS - t0)) s)"
    grep -E "Failure|Expected|actual|FAILED|Which is" "$OUT/$name.txt" | head -20
    status=1
  fi
  # The worst of each kind of comparison, per step.
  grep -E "cuda vs cpu|split vs single|rel error" "$OUT/$name.txt" | grep -v chained | sed -E 's/^ +//' |
    awk '{v=$NF; k=""; if ($0 ~ /cuda vs cpu/) k="cuda vs cpu"; else if ($0 ~ /split vs single/) k=$1" split vs single";
          else k=$1" vs transformers"; match($0, /step [0-9]/); k=k" "substr($0, RSTART, RLENGTH);
          if (!(k in m) || v+0 > m[k]+0) m[k]=v} END {for (k in m) print "  worst " k ": " m[k]}' | sort
}
gpu_part gpu_tests
gpu_part gpu_tests_no_fused TANDEM_NO_FUSED=1
gpu_part gpu_tests_pdl TANDEM_PDL=1
t0=$SECONDS
if timeout 60 "$TESTS/tandem_tests" --gtest_filter='DiffusionGemma*:ConvertDiffusionGemma*:Diffuse.*:EbGolden*' \
    >"$OUT/cpu_tests.txt" 2>&1; then
  echo "PASS cpu_tests ($((SECONDS - t0)) s): $(grep -E '^\[  PASSED' "$OUT/cpu_tests.txt")"
else
  echo "FAIL cpu_tests ($((SECONDS - t0)) s)"; grep -E "Failure|FAILED" "$OUT/cpu_tests.txt" | head -10; status=1
fi

big=()
[ "${DG_BIG:-0}" = 1 ] && big=(--big)
t0=$SECONDS
(DG_FIXTURE_TAR="$RET/dgm_fixture.tar.gz" timeout "${DG_PARITY_BUDGET:-200}" python3 -u tests/reference/diffusion_gemma_parity.py --tandem "$BIN/tandem" \
  --tests "$TESTS/tandem_tests" --gpu-tests "$TESTS/tandem_gpu_tests" --out "$OUT/parity" \
  --work /tmp/diffusion_gemma_parity_work --fixtures "$OUT/fixtures" --only "${DG_SPECS:-}" "${big[@]}";
 echo "parity rc=$?") 2>&1 | tee "$OUT/parity.txt" |
  grep --line-buffered -E "^== |PASS|FAIL|fixture (written|packed)|Error|error:|parity rc=|Traceback" | grep -v "rel error"
grep -q "diffusion-gemma parity: PASS" "$OUT/parity.txt" || status=1
echo "parity took $((SECONDS - t0)) s"
echo "diffusion_gemma device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
