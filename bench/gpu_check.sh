#!/usr/bin/env bash
# One call on a GPU machine checks and times the CUDA backend: build (or use binaries carried in gpu-bin/),
# tandem_gpu_tests, compute-sanitizer on a subset, `tandem bench --kernels`, the random-weight bench models
# (bench/models.sh) and `tandem bench` on them. Logs go to $OUT (the run tool's folder) or /tmp/gpu_check.
#
# The GPU image has CMake, ninja, nvcc 13.0, nlohmann-json, CLI11 and GoogleTest headers but no PCRE2 development
# files (seen 2025-12-02), so `cmake` fails there: build here with CUDA on (sm_90) and carry the two binaries:
#   cmake -S . -B build-cuda -G Ninja -DTANDEM_CUDA=ON -DTANDEM_NCCL=OFF -DTANDEM_MPI=OFF && cmake --build build-cuda -j2 \
#     --target tandem_cli tandem_gpu_tests && mkdir -p gpu-bin && cp build-cuda/bin/tandem \
#     build-cuda/tests/tandem_gpu_tests gpu-bin/ && strip gpu-bin/*        (gpu-bin/ is git-ignored locally)
# then pass carry=["gpu-bin"] to the run tool. (-DTANDEM_NCCL=OFF keeps libnccl.so out of the binary's
# dependencies; the image does have libnccl.so.2: on 2026-12-03 binaries built with NCCL ran there.
# -DTANDEM_MPI=OFF keeps libmpi.so out; whether the image has MPI was not checked.)
#
# usage: bench/gpu_check.sh            (from the repository root)
#   STAGES="info build tests kernels models bench sanitizer nographs split"   stages, run in this order (default:
#                                                           all but nographs and split)
#   MODELS="qwen3-0.6b qwen3-8b"                             bench model shapes
#   TYPES="bf16 q8_0 q4_k"                                   bench model types
#   BENCH_ARGS="-p 512 -n 128 -b 1,8,32 -r 3"                 tandem bench arguments
#   DEADLINE=seconds                                         no stage starts after this (device time is short)
#   CMAKE_ARGS="-DTANDEM_WERROR=OFF"                        extra cmake arguments of the build stage
#   BASE_BIN=dir                                             a second build (e.g. the previous commit's tandem) that
#                                                            bench and split also run, right after BIN, on the same
#                                                            files: before/after in one run
#   T_TESTS, T_SAN, T_KERNELS, T_MODELS, T_BENCH             per-stage time limits in seconds
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
STAGES=${STAGES:-"info build tests kernels models bench sanitizer"}
MODELS=${MODELS:-"qwen3-0.6b qwen3-8b"}
TYPES=${TYPES:-"bf16 q8_0 q4_k"}
BENCH_ARGS=${BENCH_ARGS:-"-p 512 -n 128 -b 1,8,32 -r 3"}
DEADLINE=${DEADLINE:-100000}
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
stage() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }

# Models in RAM (/dev/shm) when it has room for the 8B set (~50 GB at the peak), else on disk.
shm_free=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
if [ -z "${MODEL_DIR:-}" ]; then
  if [ "${shm_free:-0}" -ge 60 ]; then MODEL_DIR=/dev/shm/tandem-models; else MODEL_DIR=/tmp/tandem-models; fi
fi

# Libraries the carried binaries need (cuBLASLt, cudart) may live in the Python packages rather than in the
# toolkit's lib64: add whatever directory holds them.
for lib in libcublasLt.so.13 libcudart.so.13; do
  if ! ldconfig -p 2>/dev/null | grep -q "$lib" && ! ls /usr/local/cuda/lib64/$lib >/dev/null 2>&1; then
    d=$(dirname "$(find / -name "$lib*" -not -path "/proc/*" 2>/dev/null | head -1)" 2>/dev/null)
    [ -n "$d" ] && [ "$d" != "." ] && export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH" && echo "using $lib from $d"
  fi
done

BIN=""
if [ -x gpu-bin/tandem ] && [ -x gpu-bin/tandem_gpu_tests ]; then
  if gpu-bin/tandem --version >/dev/null 2>&1 && gpu-bin/tandem_gpu_tests --gtest_list_tests >/dev/null 2>&1; then
    BIN=gpu-bin
  else
    echo "carried binaries in gpu-bin/ do not run here:"; ldd gpu-bin/tandem | grep -i "not found"
  fi
fi

do_info() {
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  nvcc --version | tail -1
  git log --oneline -1 2>/dev/null || true
}

do_build() {
  [ -n "$BIN" ] && { echo "using carried binaries"; return; }
  cmake -S . -B build-gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j16 --target tandem_cli tandem_gpu_tests >>"$OUT/build.log" 2>&1
  local rc=$?
  tail -20 "$OUT/build.log"
  grep -E "warning:" "$OUT/build.log" | sort | uniq | head -20  # (with CMAKE_ARGS=-DTANDEM_WERROR=OFF)
  [ $rc -eq 0 ] && cp build-gpu/tests/tandem_gpu_tests build-gpu/bin/ && BIN=build-gpu/bin
}

do_tests() {
  timeout "${T_TESTS:-200}" "$BIN/tandem_gpu_tests" --gtest_brief=1 2>&1 | tail -80
}

do_sanitizer() {
  local sub='GpuOps.*:GpuMatmul.StridedActivations:GpuAttention.SmallCasesForSanitizer:GpuAttention.Evicted*:GpuAttention.ExplicitMaskDecodeSized:GpuStepApi.*:GpuDevice.GraphCapture*:GpuShippedModel.*'
  timeout "${T_SAN:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tandem_gpu_tests" --gtest_brief=1 \
    --gtest_filter="$sub" >"$OUT/sanitizer.log" 2>&1
  echo "memcheck exit code $? (filter $sub)"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | tail -5
  if [ -n "${RACECHECK:-1}" ] && [ "${RACECHECK:-1}" != 0 ]; then
    timeout "${T_SAN:-150}" compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/tandem_gpu_tests" --gtest_brief=1 \
      --gtest_filter='GpuAttention.SmallCasesForSanitizer:GpuOps.SmallSamplingForSanitizer' >>"$OUT/sanitizer.log" 2>&1
    echo "racecheck exit code $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/sanitizer.log" | tail -3
  fi
}

do_kernels() {
  timeout "${T_KERNELS:-120}" "$BIN/tandem" bench --kernels -o md 2>&1 | tee "$OUT/kernels.md"
}

do_models() {
  FAST_QUANT=${FAST_QUANT:-1} timeout "${T_MODELS:-300}" bench/models.sh "$MODEL_DIR" "$BIN/tandem" "$MODELS" 2>&1 | tail -20
}

do_bench() {
  for shape in $MODELS; do
    for q in $TYPES; do
      local f="$MODEL_DIR/$shape-$q.gguf"
      [ -f "$f" ] || continue
      [ "$SECONDS" -lt "$DEADLINE" ] || { echo "skip $f: past ${DEADLINE}s"; continue; }
      for b in "$BIN" ${BASE_BIN:-}; do
        echo "--- $f ($b)"
        timeout "${T_BENCH:-90}" "$b/tandem" bench -m "$f" $BENCH_ARGS -o md 2>&1 | tee -a "$OUT/bench.md"
      done
    done
  done
}

# tg batch 1 without CUDA graphs, for the graph's share of the step time.
do_nographs() {
  for shape in $MODELS; do
    local f="$MODEL_DIR/$shape-bf16.gguf"
    [ -f "$f" ] || continue
    echo "--- $f, TANDEM_NO_GRAPHS=1"
    TANDEM_NO_GRAPHS=1 timeout "${T_BENCH:-90}" "$BIN/tandem" bench -m "$f" -p 0 -n 64 -b 1 -r 2 -o md 2>&1 | tail -3 |
      tee -a "$OUT/bench.md"
  done
}

# Split modes on the one GPU: the split tests (two ranks sharing cuda:0 through the copy comm), then tandem bench
# of each split mode over cuda:0,cuda:0 against none, on the first bench model of SPLIT_TYPE (default bf16).
do_split() {
  timeout "${T_TESTS:-200}" "$BIN/tandem_gpu_tests" --gtest_filter='GpuSplit*:CommGpu*:GpuComm*' 2>&1 |
    grep -E "^\[ split|OK|FAILED|PASSED|Failure|Which|error" | tail -40
  local shape=${MODELS%% *} f args=${SPLIT_BENCH_ARGS:-"-p 512 -n 64 -b 1,8 -r 2"}
  f="$MODEL_DIR/$shape-${SPLIT_TYPE:-bf16}.gguf"
  [ -f "$f" ] || { echo "no $f: skip split bench"; return; }
  for mode in none tensor layer row; do
    [ "$SECONDS" -lt "$DEADLINE" ] || { echo "skip split $mode: past ${DEADLINE}s"; continue; }
    for b in "$BIN" ${BASE_BIN:-}; do
      echo "--- $f, --split-mode $mode ($b)"
      timeout "${T_BENCH:-90}" "$b/tandem" bench -m "$f" --devices cuda:0,cuda:0 --split-mode "$mode" $args -o md 2>&1 | tee -a "$OUT/split.md"
    done
  done
}

for s in $STAGES; do
  if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "=== skip $s: past ${DEADLINE}s"; continue; fi
  stage "$s"
  if [ -z "$BIN" ] && [ "$s" != info ] && [ "$s" != build ]; then echo "no binaries: skip"; continue; fi
  "do_$s"
done
stage done
