#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, CPU backend only) in a build directory of their own and
# runs each for SECONDS, starting from its committed seed corpus (fuzz/corpus/<target>/, read only: new inputs
# go to a scratch corpus). Exits non-zero on the first finding (libFuzzer writes the crashing input to the
# scratch directory and prints it). ctest fuzz_smoke runs it with 30 s each; docs/RELIABILITY.md has long runs.
#
# usage: fuzz/run_fuzzers.sh SECONDS|runs=N [BUILD_DIR] [TARGETS...]
set -euo pipefail
seconds=${1:?usage: fuzz/run_fuzzers.sh SECONDS|runs=N [BUILD_DIR] [TARGETS...]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${2:-$root/build-fuzz}
shift $(($# >= 2 ? 2 : $#))
targets=("$@")

mkdir -p "$build"
build=$(cd "$build" && pwd)  # absolute: each fuzzer runs from its scratch directory
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_MPI=OFF \
    -DTANDEM_FUZZ_SMOKE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/fuzz-configure.log" 2>&1 ||
    { cat "$build/fuzz-configure.log"; exit 1; }
fi
if ((${#targets[@]} == 0)); then
  targets=(fuzz_gguf fuzz_tokenizer fuzz_safetensors fuzz_hf_json fuzz_model_loader fuzz_cli_flags fuzz_chat_template)
  # fuzz_serve_request exists only where cpp-httplib is installed (fuzz/CMakeLists.txt)
  grep -q "fuzz_serve_request" "$build/build.ninja" 2>/dev/null && targets+=(fuzz_serve_request)
fi
cmake --build "$build" --target "${targets[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log"; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  seeds=()
  [ -d "$here/corpus/$t" ] && seeds=("$here/corpus/$t")
  echo "--- $t: ${seconds}s"
  # A crashing input is kept in $build/fuzz-artifacts/<target>/ (the scratch corpus is deleted on exit), and
  # the whole log in $build/fuzz-artifacts/<target>.log.
  mkdir -p "$build/fuzz-artifacts/$t"
  status=0
  # "runs=N": N inputs from a fixed seed (the same inputs on every machine: what CI runs); else SECONDS of time.
  if [ "${seconds#runs=}" != "$seconds" ]; then limit=(-runs="${seconds#runs=}" -seed=1); else limit=(-max_total_time="$seconds"); fi
  (cd "$scratch/$t" && "$build/fuzz/$t" "${limit[@]}" -timeout=20 -rss_limit_mb=4096 \
    -artifact_prefix="$build/fuzz-artifacts/$t/" -print_final_stats=1 "$scratch/$t" "${seeds[@]}" \
    >"$build/fuzz-artifacts/$t.log" 2>&1; rc=$?; tail -15 "$build/fuzz-artifacts/$t.log"; exit $rc) || status=$?
  [ "$status" -eq 0 ] || { echo "FAIL: $t found a problem (exit $status)"; exit 1; }
done
echo "all fuzzers clean"
