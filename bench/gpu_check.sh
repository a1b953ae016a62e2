#!/usr/bin/env bash
# One call on a GPU machine checks and times the CUDA backend: build (or use binaries carried in gpu-bin/),
# tandem_gpu_tests, compute-sanitizer on a subset, `tandem bench --kernels`, the random-weight bench models
# (bench/models.sh) and `tandem bench` on them. Logs go to $OUT (the run tool's folder) or /tmp/gpu_check.
#
# usage: bench/gpu_check.sh            (from the repository root)
#   STAGES="info build tests sanitizer kernels models bench"   which stages to run (default: all)
#   MODELS="qwen3-0.6b qwen3-8b"                             bench model shapes
#   BENCH_ARGS="-p 512 -n 128 -b 1,8,32 -r 3"                 tandem bench arguments
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
STAGES=${STAGES:-"info build tests sanitizer kernels models bench"}
MODELS=${MODELS:-"qwen3-0.6b qwen3-8b"}
BENCH_ARGS=${BENCH_ARGS:-"-p 512 -n 128 -b 1,8,32 -r 3"}
# Models in RAM (/dev/shm) when it has room for the 8B set (~50 GB at the peak), else on disk.
shm_free=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
if [ -z "${MODEL_DIR:-}" ]; then
  if [ "${shm_free:-0}" -ge 60 ]; then MODEL_DIR=/dev/shm/tandem-models; else MODEL_DIR=/tmp/tandem-models; fi
fi
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
DEADLINE=${DEADLINE:-100000}  # seconds after which no further stage starts (the device time is short)
has() { [[ " $STAGES " == *" $1 "* ]] && { [ "$SECONDS" -lt "$DEADLINE" ] || { echo "=== skip $1: past ${DEADLINE}s"; false; }; }; }
stage() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }

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

if has info; then
  stage info
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  nvcc --version | tail -1
  git log --oneline -1 2>/dev/null || true
  for h in /usr/include/nlohmann /usr/include/CLI /usr/include/gtest; do [ -d $h ] && echo "have $h" || echo "no $h"; done
  pkg-config --exists libpcre2-8 && echo "have pcre2 (pkg-config)" || echo "no pcre2 pkg-config"
fi

if has build && [ -z "$BIN" ]; then
  stage build
  cmake -S . -B build-gpu -G Ninja -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j16 --target tandem_cli tandem_gpu_tests >>"$OUT/build.log" 2>&1
  rc=$?
  tail -20 "$OUT/build.log"
  [ $rc -eq 0 ] && BIN=build-gpu/bin && cp build-gpu/tests/tandem_gpu_tests build-gpu/bin/ 2>/dev/null
fi
[ -z "$BIN" ] && { echo "no binaries: stopping"; exit 1; }
echo "binaries: $BIN"

if has tests; then
  stage tests
  timeout ${T_TESTS:-200} "$BIN/tandem_gpu_tests" --gtest_brief=1 2>&1 | tail -80
fi

if has kernels; then
  stage kernels
  timeout ${T_KERNELS:-120} "$BIN/tandem" bench --kernels -o md 2>&1 | tee "$OUT/kernels.md"
fi

if has models; then
  stage models
  FAST_QUANT=${FAST_QUANT:-1} timeout ${T_MODELS:-300} bench/models.sh "$MODEL_DIR" "$BIN/tandem" "$MODELS" 2>&1 | tail -20
fi

if has bench; then
  stage bench
  for shape in $MODELS; do
    for q in bf16 q8_0 q4_k; do
      f="$MODEL_DIR/$shape-$q.gguf"
      [ -f "$f" ] || continue
      echo "--- $f"
      timeout ${T_BENCH:-90} "$BIN/tandem" bench -m "$f" $BENCH_ARGS -o md 2>&1 | tee -a "$OUT/bench.md"
    done
  done
fi
if has sanitizer; then
  stage compute-sanitizer
  SUB='GpuOps.*:GpuMatmul.StridedActivations:GpuAttention.*:GpuDevice.GraphCapture*:GpuShippedModel.*'
  timeout ${T_SAN:-150} compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/tandem_gpu_tests" --gtest_brief=1 --gtest_filter="$SUB" \
    >"$OUT/sanitizer.log" 2>&1
  echo "memcheck exit code $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | tail -5
  timeout ${T_SAN:-150} compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/tandem_gpu_tests" --gtest_brief=1 \
    --gtest_filter='GpuAttention.SmallCasesForSanitizer:GpuOps.SmallSamplingForSanitizer:GpuMatmul.StridedActivations' \
    >>"$OUT/sanitizer.log" 2>&1
  echo "racecheck exit code $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/sanitizer.log" | tail -3
fi

stage done
