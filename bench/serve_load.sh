#!/usr/bin/env bash
# Load test of `tandem serve`: starts the server on a free port with the given model and flags, then runs
# bench/serve_load.py (concurrent streaming clients, optional random aborts) at several concurrency levels and
# prints throughput, TTFT / inter-token latency percentiles, KV use and the server's RSS per level.
#
#   bench/serve_load.sh [-m MODEL.gguf] [--parallel N] [--ctx N] [--bin build/bin/tandem]
#                       [--serve-args "MORE SERVER FLAGS"] [-- LOAD_ARGS...]
#   bench/serve_load.sh --parallel 16 --ctx 16384 -- --concurrency 1,4,16,64 --duration 60 --abort 0.1
#   bench/serve_load.sh --parallel 32 --ctx 16384 --serve-args "--queue-timeout 300" -- --concurrency 64 \
#     --duration 600 --abort 0.1          # the 10-minute soak of BENCHMARKS.md
#
# Everything after `--` goes to serve_load.py (see its --help). Exits non-zero when a request was lost or KV
# cells stayed in use after the load.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/tandem
model=""
parallel=8
ctx=8192
serve_args=""
while (($#)); do
  case "$1" in
    -m) model=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "no tandem binary at $bin (build it, or give --bin)" >&2; exit 2; }
out=$(mktemp)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
# shellcheck disable=SC2086  # serve_args is a list of flags
"$bin" serve --port 0 --parallel "$parallel" --ctx "$ctx" --kv-unified ${model:+-m "$model"} $serve_args >"$out" &
pid=$!
for _ in $(seq 600); do
  grep -q "listening on" "$out" && break
  kill -0 "$pid" 2>/dev/null || { echo "tandem serve exited before listening" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$out")
[[ -n $port ]] || { echo "tandem serve did not print its port" >&2; exit 1; }
echo "tandem serve: $(head -1 "$out"), commit $(git rev-parse --short=12 HEAD), $(date -u +%FT%TZ)"
python3 bench/serve_load.py --url "http://127.0.0.1:$port" --pid "$pid" "$@"
