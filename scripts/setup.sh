#!/usr/bin/env bash
# Installs the Debian packages tandem builds with. Safe to run again: installs only what is missing.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected under /usr/local/cuda when present; without it tandem
# builds its CPU backend only.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config git python3 libgtest-dev libcli11-dev nlohmann-json3-dev libpcre2-dev
  libcpp-httplib-dev clang libclang-rt-14-dev openmpi-bin libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
