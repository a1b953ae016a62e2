#!/usr/bin/env bash
# tandem vs transformers on randomly initialised qwen3 / llama models (tests/reference/model_parity.py has the
# details and the definition of the figures). One command, from anywhere, on a machine with PyTorch and
# transformers (the GPU machine):
#
#   tests/reference/run_model_parity.sh [model_parity.py options, e.g. --only qwen3_tiny,llama_tiny]
#
# The tandem binary: $TANDEM_BIN if set; else build-parity/tandem when it runs here (a static CPU build carried
# from the dev machine); else a CPU build made here (needs the README's build dependencies). Results go to $OUT
# (default /tmp/tandem_model_parity_out): summary.txt, results.json, and the CI fixture files
# (<model>.gguf + <model>.json) to copy into tests/data/models/.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/tandem_model_parity_out}
mkdir -p "$OUT"
BIN=${TANDEM_BIN:-}
if [ -z "$BIN" ] && [ -x "$ROOT/build-parity/tandem" ] && "$ROOT/build-parity/tandem" --version >/dev/null 2>&1; then
  BIN=$ROOT/build-parity/tandem
fi
if [ -z "$BIN" ]; then
  echo "building tandem (CPU) in $ROOT/build-ref"
  if ! { cmake -S "$ROOT" -B "$ROOT/build-ref" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_TESTS=OFF \
           -DCMAKE_BUILD_TYPE=Release && cmake --build "$ROOT/build-ref" -j"$(nproc)" --target tandem_cli; } \
       >"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    exit 1
  fi
  BIN=$ROOT/build-ref/bin/tandem
fi
echo "tandem: $BIN ($("$BIN" --version))"
exec python3 "$ROOT/tests/reference/model_parity.py" --tandem "$BIN" --out "$OUT" "$@"
