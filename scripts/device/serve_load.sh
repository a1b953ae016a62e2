#!/usr/bin/env bash
# `tandem serve` vs llama-server under the same streaming load on the H200 (issue 20), Qwen3-8B shape with
# random weights (bench/models.sh FAST_QUANT=1: random valid Q8_0 blocks; speed does not depend on values).
#
# SHORT version of the issue's 10-minute soak: each server gets one run of CLIENTS concurrent streaming
# clients for DURATION seconds (default 64 clients, 90 s each), prompts of 4..48 random words, max_tokens 64,
# temperature 0.8, ignore_eos, 10% of the requests aborted mid-stream (bench/serve_load.py). Reported per
# server: done / aborted / lost requests, generated tokens/s, p50/p99 time to first token and inter-token
# latency, RSS and GPU memory sampled over the run (flat or not), and for tandem the KV cells left after the
# load (must be 0).
#
# Also, first and on the CPU while the model is made: the CPU tests that check "same seed, same text whatever
# else runs" (Serve.SameSeedSameTextWhateverElseRuns failed once in this machine's ctest), repeated, with their
# full output kept (serve_seed_tests_*.txt), and the batch-invariance test of the CPU forward behind it.
# SEED_ONLY=1: only that (about 60 s, no model, no peer).
#
# Run after build-gpu/ (run_all.sh) with the peer: PEER_BUILD=your-script TOPICS="serve_load:460" bash scripts/device/run_all.sh
# env: BIN, OUT, MODELS (default /tmp/tandem-models; an existing qwen3-8b-q8_0.gguf there, e.g. made by
# dflash_8b in the same call, is reused), LLAMA_CPP_BIN (the peer's bin/, from your PEER_BUILD), CLIENTS,
# DURATION, PARALLEL, CTX, DEVICE (cpu: both servers on the CPU with THREADS threads), MODEL (a file instead of
# the 8B one), ABORT (fraction aborted, default 0.1). Budget: ~200 s to make the model when it is not there yet, + 2 x (DURATION + ~40 s).
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/serve_load}
MODELS=${MODELS:-/tmp/tandem-models}
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-90}
PARALLEL=${PARALLEL:-64}
CTX=${CTX:-32768}
DEVICE=${DEVICE:-cuda:0}  # tandem's device (cpu: a dry run of this script on a machine without a GPU)
mkdir -p "$OUT" "$MODELS"
fail=0
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), nproc $(nproc), GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"

# 1. The seed tests, on the CPU, while the model is made (they use the small shipped model): 6 processes at
# once, as ctest -j runs them beside each other (each starts its own server using every core).
seed_tests() {
  local pids=() i
  for i in 1 2 3 4 5 6; do
    "$BIN/tandem_tests" --gtest_filter='ServeBuild.*:Serve.SameSeedSameTextWhateverElseRuns:Serve.NonStreamed*:*CpuBatchInvariance.*' \
      --gtest_repeat=4 > "$OUT/serve_seed_tests_$i.txt" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  echo "rc=$rc" > "$OUT/serve_seed_rc.txt"
}
if [ -x "$BIN/tandem_tests" ]; then
  seed_tests &
  seed_pid=$!
fi
if [ "${SEED_ONLY:-0}" = 1 ]; then
  wait "$seed_pid"
  cat "$OUT"/serve_seed_tests_*.txt | grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|Value of|Actual|got\[4\]|differ" | sort | uniq -c | head -40
  grep -h -A12 "Failure" "$OUT"/serve_seed_tests_*.txt | head -60
  grep -q "rc=0" "$OUT/serve_seed_rc.txt" && echo "serve_load.sh (seed tests only): PASS" || echo "serve_load.sh (seed tests only): FAIL"
  exit 0
fi

# 2. The 8B model (or MODEL=file: that file instead, e.g. the shipped small model for a CPU side-by-side).
t0=$SECONDS
if [ -n "${MODEL:-}" ]; then
  M=$MODEL
else
  FAST_QUANT=1 bash bench/models.sh "$MODELS" "$BIN/tandem" qwen3-8b > "$OUT/models.txt" 2>&1 || {
    echo "FAIL making the qwen3-8b model (see models.txt)"; tail -5 "$OUT/models.txt"; exit 1; }
  M=$MODELS/qwen3-8b-q8_0.gguf
fi
echo "model $M ($(stat -c %s "$M") bytes) ready after $((SECONDS - t0)) s"
if [ -n "${seed_pid:-}" ]; then
  wait "$seed_pid"
  cat "$OUT"/serve_seed_tests_*.txt | grep -E "^\[  (PASSED|FAILED) " | sort | uniq -c | head -20
  grep -h -A12 "Failure" "$OUT"/serve_seed_tests_*.txt | head -40
  grep -q "rc=0" "$OUT/serve_seed_rc.txt" && echo "seed tests: PASS" || { echo "seed tests: FAIL"; fail=1; }
fi

LOAD="--concurrency $CLIENTS --duration $DURATION --max-tokens 64 --abort ${ABORT:-0.1} --timeout 600"
[ "$DEVICE" != cpu ] && LOAD="$LOAD --vram"
# On the CPU both servers get the same threads (THREADS, default all cores) and llama-server no GPU layers.
NGL=99; T_ARGS=(); L_ARGS=()
if [ "$DEVICE" = cpu ]; then
  NGL=0; T_ARGS=(-t "${THREADS:-$(nproc)}"); L_ARGS=(-t "${THREADS:-$(nproc)}" -tb "${THREADS:-$(nproc)}")
fi

wait_port() {  # url pid log
  for _ in $(seq 600); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$1/health', timeout=2).status == 200 else 1)" \
      >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "server exited:"; tail -5 "$3"; return 1; }
    sleep 0.5
  done
  return 1
}

# 3. tandem serve on the GPU.
port=18080
"$BIN/tandem" serve -m "$M" --devices "$DEVICE" --port $port --parallel "$PARALLEL" --ctx "$CTX" --kv-unified \
  "${T_ARGS[@]}" --queue-timeout 600 > "$OUT/tandem_server.log" 2>&1 &
pid=$!
if wait_port "http://127.0.0.1:$port" $pid "$OUT/tandem_server.log"; then
  echo "--- tandem serve: --devices $DEVICE --parallel $PARALLEL --ctx $CTX --kv-unified"
  python3 bench/serve_load.py --url "http://127.0.0.1:$port" --pid $pid $LOAD --json "$OUT/tandem.json" \
    2>&1 | tee "$OUT/tandem_load.txt" || fail=1
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
    > "$OUT/tandem_metrics.txt" 2>&1
else
  echo "FAIL: tandem serve did not come up"; fail=1
fi
kill $pid 2>/dev/null; wait $pid 2>/dev/null

# 4. llama-server, same GGUF, same load (unified KV of the same size, same slots, all layers on the GPU).
LS=${LLAMA_CPP_BIN:-/tmp/llama.cpp/build/bin}/llama-server
# run_all.sh waits for the peer build only before topics named peer_* / serve / gemma4: wait for it here
# (/tmp/peer_build.rc is written when it ends).
if [ ! -x "$LS" ] && [ -n "${LLAMA_CPP_BIN:-}" ]; then
  for _ in $(seq 300); do
    [ -x "$LS" ] && break
    [ -f /tmp/peer_build.rc ] && break
    sleep 1
  done
fi
if [ -x "$LS" ]; then
  port=18081
  "$LS" -m "$M" -ngl $NGL "${L_ARGS[@]}" --port $port -c "$CTX" -np "$PARALLEL" -kvu > "$OUT/llama_server.log" 2>&1 &
  pid=$!
  if ! kill -0 $pid 2>/dev/null || ! wait_port "http://127.0.0.1:$port" $pid "$OUT/llama_server.log"; then
    # an older llama-server without -kvu
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    "$LS" -m "$M" -ngl $NGL "${L_ARGS[@]}" --port $port -c "$CTX" -np "$PARALLEL" > "$OUT/llama_server.log" 2>&1 &
    pid=$!
    wait_port "http://127.0.0.1:$port" $pid "$OUT/llama_server.log" || { echo "FAIL: llama-server did not come up"; fail=1; }
  fi
  if kill -0 $pid 2>/dev/null; then
    echo "--- llama-server: -ngl $NGL ${L_ARGS[*]} -c $CTX -np $PARALLEL -kvu"
    python3 bench/serve_load.py --url "http://127.0.0.1:$port" --pid $pid $LOAD --no-kv-check \
      --json "$OUT/llama.json" 2>&1 | tee "$OUT/llama_load.txt" || fail=1
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
else
  echo "no llama-server at $LS (a built llama.cpp; run_all.sh runs your PEER_BUILD): tandem only"
fi

python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = []
for name in ("tandem", "llama"):
    p = os.path.join(out, name + ".json")
    if os.path.exists(p):
        for l in json.load(open(p))["levels"]:
            rows.append((name, l))
print("| server | clients | s | done | aborted | lost | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
      " RSS MiB start..end | GPU MiB start..end |")
for name, l in rows:
    s = l["samples"]
    print(f"| {name} | {l['clients']} | {l['seconds']:.0f} | {l['done']} | {l['aborted']} | {l['lost']} | "
          f"{l['tokens_per_s']:.0f} | {l['ttft_p50_ms']:.0f} | {l['ttft_p99_ms']:.0f} | {l['itl_p50_ms']:.1f} | "
          f"{l['itl_p99_ms']:.1f} | {s[1][1] if len(s) > 1 else s[0][1]}..{s[-1][1]} | "
          f"{s[1][2] if len(s) > 1 else s[0][2]}..{s[-1][2]} |")
EOF
if [ $fail -eq 0 ]; then echo "serve_load.sh: PASS"; else echo "serve_load.sh: FAIL"; fi
