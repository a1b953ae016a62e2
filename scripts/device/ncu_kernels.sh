#!/usr/bin/env bash
# Nsight Compute on the kernels the profiles point at (run by scripts/device/run_all.sh; BIN, OUT set), to read
# *why* they run below the bandwidth (stall reasons, occupancy, achieved bytes) before changing them:
#   attn32k  the split decode attention at a 32768-token context (Qwen3-8B-shape bf16: issue 19's depth goal)
#   q8mma16  the tensor-core Q8_0 product at 16 columns (a batch-16 decode step: issue 18's verify pass)
#   g4tail   gemma4's MoE tail and input norms (post_norm_residual*, moe_input_norms*), 26B-A4B shape, 4 layers,
#            then again with G4_NCU_AB (one VAR=value; default TANDEM_MOE_TAIL=0) (g4tail_ab)
# NCU_CASES picks cases (default all three); each writes $OUT/<case>.txt (the sections' details of a few launches
# after the warm-up). Files: the Qwen3-8B-shape files of bench/models.sh in MODELS
# (/dev/shm/tandem-models, PREP_MODELS=1), the 8B Q8_0 of q8_mma_bench.sh, gemma4's template made here.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}; OUT=${OUT:-/tmp/ncu_kernels}; mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "FAIL: no ncu on this machine"; exit 1; }
echo "ncu: $NCU ($("$NCU" --version | tail -1))"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
--section WarpStateStats --section SchedulerStats --section SourceCounters"
# NCU_SET=full: every section (shared-memory bank conflicts, the memory tables, stall sampling by source line);
# several times slower a launch.
[ -n "${NCU_SET:-}" ] && SECTIONS="--set $NCU_SET"
M=${MODELS:-/dev/shm/tandem-models}
status=0
run_case() {  # name, kernel regex, launches skipped, launches profiled, then the command
  local name=$1 regex=$2 skip=$3 count=$4; shift 4
  echo "=== $(date +%T) $name: $*"
  timeout "${NCU_CASE_TIMEOUT:-150}" "$NCU" --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    $SECTIONS "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc"
  [ $rc -ne 0 ] && { status=1; tail -5 "$OUT/$name.txt"; }
  # the headline lines: duration, throughput, occupancy, the top stall reasons
  grep -E "^  [a-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|One or More Eligible|Issued Warp" \
    "$OUT/$name.txt" | head -60
}
for c in ${NCU_CASES:-attn32k q8mma16 g4tail}; do
  case $c in
    attn32k)
      f=$M/qwen3-8b-bf16.gguf
      [ -f "$f" ] || { echo "SKIP attn32k: no $f"; continue; }
      # skip the prefill's launches of the kernel (if any) and the first decode step's layers
      run_case attn32k "attention_split_kernel" 40 2 "$BIN/tandem" bench -m "$f" -p 0 -n 3 -d 32768 -b 1 -r 1 ;;
    q8mma16)
      f=${Q8_FILE:-/dev/shm/tandem-8b/qwen3-8b-random-q8_0.gguf}
      [ -f "$f" ] || f=$M/qwen3-8b-q8_0.gguf
      [ -f "$f" ] || { echo "SKIP q8mma16: no Q8_0 file"; continue; }
      run_case q8mma16 "gemv_q8_mma" 20 4 "$BIN/tandem" bench -m "$f" -p 0 -n 3 -b 16 -r 1 ;;
    g4tail)
      T=/tmp/gemma4_ncu_template.gguf; f=/dev/shm/gemma4_ncu_bf16.gguf
      python3 scripts/device/gemma4_moe_template.py "$T" --layers 4 >/dev/null &&
        "$BIN/tandem" bench -m "$T" --random-weights bf16 --to "$f" >/dev/null 2>&1 ||
        { echo "FAIL g4tail files"; status=1; continue; }
      run_case g4tail "post_norm_residual|moe_input_norms|attn_inputs" 24 8 "$BIN/tandem" bench -m "$f" -p 0 -n 3 -b 1 -r 1
      # the same launches with the other way of G4_NCU_AB (default: the MoE tail of the 256-thread kernel), side by side
      export ${G4_NCU_AB:-TANDEM_MOE_TAIL=0}
      run_case g4tail_ab "post_norm_residual|moe_input_norms|attn_inputs" 24 8 \
        "$BIN/tandem" bench -m "$f" -p 0 -n 3 -b 1 -r 1
      unset "$(echo "${G4_NCU_AB:-TANDEM_MOE_TAIL=0}" | cut -d= -f1)"
      rm -f "$f" ;;
    *) echo "unknown case $c"; status=1 ;;
  esac
done
exit $status
