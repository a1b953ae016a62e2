#!/usr/bin/env bash
# Installs the Debian / Ubuntu packages tandem builds with. Safe to run again: installs only what is missing.
# Works on Debian 12 and 13 and Ubuntu 24.04 (GCC and clang): package names that differ between them (the
# clang runtime with libFuzzer and the sanitizers is libclang-rt-<clang major>-dev) are picked for the clang
# this distribution installs. The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected under /usr/local/cuda when
# present; without it tandem builds its CPU backend only.
set -euo pipefail
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
updated=0
install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  if ((updated == 0)); then
    $SUDO apt-get update -qq
    updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
}
install_missing cmake ninja-build g++ pkg-config git python3 libgtest-dev libcli11-dev nlohmann-json3-dev \
  libpcre2-dev libcpp-httplib-dev clang openmpi-bin libopenmpi-dev curl ca-certificates
# The runtime of the clang just installed (fuzzers, sanitizers): libclang-rt-14-dev on Debian 12, -18- on
# Ubuntu 24.04, -19- on Debian 13.
clang_major=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
if [[ -n "$clang_major" ]] && apt-cache show "libclang-rt-$clang_major-dev" >/dev/null 2>&1; then
  install_missing "libclang-rt-$clang_major-dev"
fi
# Node.js for the `tandem serve` client test (tests/node, ctest serve_node_client): node from the distribution
# when it is missing, then the openai npm package into tests/node/node_modules. The npm step is best effort:
# without network the test falls back to fetch, and without node it is skipped with a message.
command -v node >/dev/null 2>&1 || install_missing nodejs
command -v npm >/dev/null 2>&1 || install_missing npm
if command -v npm >/dev/null 2>&1; then
  (cd "$(dirname "$0")/../tests/node" && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "setup.sh: 'npm ci' in tests/node failed (no network?): the Node.js client test will use fetch" >&2
fi
