#!/usr/bin/env bash
# ctest `serve_node_client`: the Node.js client test against `tandem serve`. Skipped (exit 77, which ctest
# reports as "Skipped") when node is not installed; scripts/setup.sh installs it and the openai package.
set -euo pipefail
tandem_bin=${1:?usage: run.sh TANDEM_BIN}
if ! command -v node >/dev/null 2>&1; then
  echo "SKIPPED: node is not installed (scripts/setup.sh installs it); the Node.js client test did not run"
  exit 77
fi
cd "$(dirname "$0")"
exec node serve_client_test.mjs "$tandem_bin"
