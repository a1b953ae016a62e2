#!/usr/bin/env bash
# Installs the Debian / Ubuntu packages tandem builds with. Safe to run again: installs only what is missing.
# Works on Debian 12 and 13 and Ubuntu 24.04, with GCC (the default) or clang: export CC=clang CXX=clang++
# (or a versioned clang++-N) before this script and cmake, and both use that compiler. Package names that differ
# between the distributions (the clang runtime with libFuzzer and the sanitizers is libclang-rt-<clang major>-dev)
# are picked for the clang in use. g++ is installed either way: it is nvcc's host compiler for the .cu files
# and provides libstdc++, which clang uses too. The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected under
# /usr/local/cuda when present; without it tandem builds its CPU backend only.
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
# The clang in use: CXX when it names a clang (clang++-19 gets the clang-19 package), else the distribution's
# `clang`, which the fuzz smoke test builds with whatever compiler the build uses.
clangxx=clang++
if [[ "$(basename "${CXX:-}")" == clang++* ]]; then
  clangxx=$CXX
  if [[ "$(basename "$CXX")" =~ ^clang\+\+-([0-9]+)$ ]]; then install_missing "clang-${BASH_REMATCH[1]}"; fi
fi
command -v "$clangxx" >/dev/null 2>&1 || { echo "setup.sh: CXX=$CXX: '$clangxx' not found" >&2; exit 1; }
# Its runtime (fuzzers, sanitizers): libclang-rt-14-dev on Debian 12, -18- on Ubuntu 24.04, -19- on Debian 13.
clang_major=$("$clangxx" --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
if [[ -n "$clang_major" ]] && apt-cache show "libclang-rt-$clang_major-dev" >/dev/null 2>&1; then
  install_missing "libclang-rt-$clang_major-dev"
fi
# clang compiles against the libstdc++ of the newest GCC it finds under /usr/lib/gcc, which can be a GCC whose
# runtime is installed without its C++ headers (Ubuntu 24.04 with parts of gcc-14 beside its default g++-13, as
# on GitHub's runner images: actions/runner-images#11229): then every #include <vector> fails. Install the
# headers of the GCC it picked.
gcc_dir=$("$clangxx" -v -x c++ -fsyntax-only /dev/null 2>&1 | sed -n 's/^Selected GCC installation: //p' | head -1)
if [[ -n "$gcc_dir" ]] && ! echo '#include <vector>' | "$clangxx" -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
  install_missing "libstdc++-$(basename "$gcc_dir")-dev"
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
