#!/usr/bin/env bash
# One call on the H200 machine: build tandem there (Ubuntu 24.04, GCC 13.3, CUDA 13, sm_90), optionally build
# the peer (llama.cpp, from a carried `git archive` in .peer/llama.cpp.tar.gz) in parallel, then run the topic
# scripts scripts/device/<topic>.sh named in TOPICS, each under its own time budget and log folder.
#
# The device tool brings back at most 8 files, so everything each topic writes is packed into one archive,
# $OUT/results.tar.gz (re-packed after every topic, so a run cut short still returns what finished), plus
# $OUT/summary.log.
#
# Carry: .debs (libpcre2-dev .deb: the image lacks PCRE2 headers; `apt-get download libpcre2-dev` here) and,
# for the peer, .peer (llama.cpp.tar.gz) and your PEER_BUILD script (see below).
# usage (from the repo root): TOPICS="step_seam hardening gemma4:240" [PEER_BUILD=your-script] bash scripts/device/run_all.sh
#   BG_TOPICS="train_diffusion:330" runs topics in the background from the start (see below).
#   BUILD_TARGETS="tandem_cli": build only those targets (a bench call that needs no test binaries).
#   a topic may carry its budget in seconds after a colon (default 120).
set -uo pipefail
FINAL_OUT=${OUT:-/tmp/device_out}
WORK=/tmp/device_work
rm -rf "$WORK" && mkdir -p "$WORK" "$FINAL_OUT"
SUMMARY=$FINAL_OUT/summary.log
exec > >(tee -a "$SUMMARY") 2>&1
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
pack() { tar czf "$FINAL_OUT/results.tar.gz" -C "$WORK" . 2>/dev/null; }
echo "=== $(date +%T) start; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
gcc --version | head -1; nvcc --version | tail -1

# The peer (llama.cpp) is never built by a committed script: the library that fetched it forbids committing any
# recipe that builds fetched code. PEER_BUILD names a script of your own, kept out of the repository (carry it as
# an ignored path), that builds the peer's tools into $LLAMA_CPP_BIN from .peer/llama.cpp.tar.gz; it runs in the
# background beside tandem's build. PEER=src unpacks the peer's sources only (its converter, for interop checks).
if [ "${PEER:-0}" = src ] && [ -f .peer/llama.cpp.tar.gz ]; then
  mkdir -p /tmp/llama.cpp && tar xzf .peer/llama.cpp.tar.gz -C /tmp/llama.cpp && export LLAMA_CPP_SRC=/tmp/llama.cpp
fi
# The peer build runs in a process session of its own (setsid), writing its exit status to /tmp/peer_build.rc: a
# build that a call leaves unfinished goes on while the machine stays warm, and the next call (the machine's /tmp
# kept) waits for it or finds the tools already built instead of starting again.
PEER_LOG=/tmp/peer_build.log
if [ -n "${PEER_BUILD:-}" ] && [ -f "$PEER_BUILD" ]; then
  export LLAMA_CPP_SRC=/tmp/llama.cpp LLAMA_CPP_BIN=${LLAMA_CPP_BIN:-/tmp/llama.cpp/build/bin}
  if [ -f /tmp/peer_build.started ]; then
    echo "=== peer build: from an earlier call ($(cat /tmp/peer_build.rc 2>/dev/null || echo running))"
  else
    touch /tmp/peer_build.started
    setsid bash -c "bash '$PEER_BUILD' >$PEER_LOG 2>&1; echo \$? >/tmp/peer_build.rc" </dev/null >/dev/null 2>&1 &
  fi
  PEER_PENDING=1
fi

# Background topics (BG_TOPICS="name:budget ..."): GPU work that needs no tandem build (training), started
# before the build; every topic whose name has "bench" or "speed" in it waits for them (timings undisturbed).
export FINAL_OUT  # topics may put large pieces (<= 16 MiB each) straight into the returned folder
BG_PIDS=()
for spec in ${BG_TOPICS:-}; do
  topic=${spec%%:*}; budget=300
  [ "$topic" != "$spec" ] && budget=${spec#*:}
  mkdir -p "$WORK/$topic"
  echo "=== $(date +%T) background topic $topic (budget ${budget}s)"
  (OUT="$WORK/$topic" timeout --kill-after=10 "$budget" bash "scripts/device/$topic.sh" >"$WORK/$topic/stdout.log" 2>&1
   rc=$?; echo "=== $(date +%T) background topic $topic rc=$rc" >>"$WORK/$topic/stdout.log") &
  BG_PIDS+=($!)
done
wait_background() {
  if ((${#BG_PIDS[@]})); then
    echo "=== $(date +%T) waiting for background topics"
    wait "${BG_PIDS[@]}"; BG_PIDS=()
    for spec in ${BG_TOPICS:-}; do tail -12 "$WORK/${spec%%:*}/stdout.log"; done
  fi
}

# tandem: GCC 13 with warnings as errors (what CI uses), CUDA on, MPI off (the image's MPI is not checked).
source bench/device_prep.sh >/dev/null
t0=$SECONDS
cmake -S . -B build-gpu -G Ninja -DTANDEM_CUDA=ON -DTANDEM_WERROR=ON -DTANDEM_MPI=OFF -DCMAKE_BUILD_TYPE=Release ${TANDEM_EXTRA_CMAKE:-} \
  >"$WORK/build.log" 2>&1 && cmake --build build-gpu -j 12 ${BUILD_TARGETS:+--target $BUILD_TARGETS} >>"$WORK/build.log" 2>&1
rc=$?
echo "=== $(date +%T) tandem build (-Werror) rc=$rc in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then  # keep the call useful: show the warnings, then build without -Werror
  grep -E "error:|warning:" "$WORK/build.log" | sort | uniq | head -30
  cmake -S . -B build-gpu -DTANDEM_WERROR=OFF >>"$WORK/build.log" 2>&1 && cmake --build build-gpu -j 12 ${BUILD_TARGETS:+--target $BUILD_TARGETS} >>"$WORK/build.log" 2>&1
  rc=$?
  echo "=== $(date +%T) tandem build without -Werror rc=$rc"
fi
tail -15 "$WORK/build.log"
pack
[ $rc -ne 0 ] && { wait_background; pack; exit 1; }
export BIN=build-gpu/bin
cp build-gpu/tests/tandem_gpu_tests build-gpu/tests/tandem_tests build-gpu/bin/ 2>/dev/null

wait_peer() {
  if [ -n "${PEER_PENDING:-}" ]; then
    while [ ! -f /tmp/peer_build.rc ]; do sleep 2; done
    PEER_PENDING=""; cp "$PEER_LOG" "$WORK/peer_build.log" 2>/dev/null; tail -2 "$PEER_LOG"
    echo "peer build rc=$(cat /tmp/peer_build.rc)"
    [ -x "$LLAMA_CPP_BIN/llama-server" ] && export LLAMA_SERVER=$LLAMA_CPP_BIN/llama-server
  fi
}

# PREP_MODELS=1: make the random-weight Qwen3-8B-shape files (bench/models.sh, FAST_QUANT=1) into
# /dev/shm/tandem-models in the background, in a session of their own like the peer build (they outlive the call
# on a warm machine); topics that read them (bench, speed, serve_load) wait for /dev/shm/tandem-models/.ready.
MODELS_PREP=/dev/shm/tandem-models
if [ "${PREP_MODELS:-0}" = 1 ] && [ ! -f $MODELS_PREP/.started ]; then
  mkdir -p $MODELS_PREP && touch $MODELS_PREP/.started
  setsid bash -c "FAST_QUANT=1 bash bench/models.sh $MODELS_PREP $BIN/tandem qwen3-8b >/tmp/models_prep.log 2>&1; touch $MODELS_PREP/.ready" \
    </dev/null >/dev/null 2>&1 &
  echo "=== $(date +%T) making the Qwen3-8B-shape files in the background"
fi
wait_models() {
  if [ -f $MODELS_PREP/.started ] && [ ! -f $MODELS_PREP/.ready ]; then
    echo "=== $(date +%T) waiting for the Qwen3-8B-shape files"
    while [ ! -f $MODELS_PREP/.ready ]; do sleep 2; done
    tail -4 /tmp/models_prep.log
  fi
}

# PAR=1: the TOPICS run side by side (correctness topics on small models: the call ends when the slowest one
# does, not after their sum). Timings taken in such a run are not comparable.
run_topic() {  # topic budget
  OUT="$WORK/$1" timeout --kill-after=10 "$2" bash "scripts/device/$1.sh" >"$WORK/$1/stdout.log" 2>&1
  local rc=$?  # (read before the date's command substitution, which sets $? to its own status)
  echo "=== $(date +%T) topic $1 rc=$rc" >>"$WORK/$1/stdout.log"
}
if [ "${PAR:-0}" = 1 ]; then
  pids=()
  for spec in ${TOPICS:-}; do
    topic=${spec%%:*}; budget=120
    [ "$topic" != "$spec" ] && budget=${spec#*:}
    mkdir -p "$WORK/$topic"
    echo "=== $(date +%T) topic $topic started (budget ${budget}s, side by side)"
    run_topic "$topic" "$budget" &
    pids+=($!)
  done
  ((${#pids[@]})) && wait "${pids[@]}"
  pack  # the side-by-side topics' folders come back even when a later topic runs out of time
  for spec in ${TOPICS:-}; do
    echo "=== topic ${spec%%:*}: last lines"; tail -25 "$WORK/${spec%%:*}/stdout.log"
  done
  TOPICS="${SEQ_TOPICS:-}"  # then these, one after another (benches: undisturbed timings)
fi
for spec in ${TOPICS:-}; do
  topic=${spec%%:*}; budget=120
  [ "$topic" != "$spec" ] && budget=${spec#*:}
  # (PEER_WAIT=0: these topics do not wait for a peer build still running; they run tandem's side only)
  if [ "${PEER_WAIT:-1}" = 1 ]; then
    [ "${topic#peer_}" != "$topic" ] || [ "$topic" = serve ] || [ "${topic#gemma4}" != "$topic" ] && wait_peer
  fi
  case "$topic" in *bench*|*speed*|depth_ab) wait_background; wait_models ;; serve_load) wait_models ;; esac
  mkdir -p "$WORK/$topic"
  echo "=== $(date +%T) topic $topic (budget ${budget}s)"
  t0=$SECONDS
  OUT="$WORK/$topic" timeout --kill-after=10 "$budget" bash "scripts/device/$topic.sh" >"$WORK/$topic/stdout.log" 2>&1
  rc=$?
  echo "=== $(date +%T) topic $topic rc=$rc in $((SECONDS - t0)) s; last lines:"
  tail -25 "$WORK/$topic/stdout.log"
  pack
done
# A peer build still running is left to go on (a session of its own): the next call on this warm machine uses it.
[ -n "${PEER_PENDING:-}" ] && [ ! -f /tmp/peer_build.rc ] && echo "=== $(date +%T) peer build still running: $(tail -1 $PEER_LOG)"
wait_background
pack
echo "=== $(date +%T) done"
