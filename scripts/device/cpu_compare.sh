#!/usr/bin/env bash
# Issue 19's CPU goal: the shipped small model on the CPU at least as fast as llama.cpp's CPU path on the same
# GGUF with the same threads. On the H200 machine's CPU (16 cores; the peer built by run_all.sh with PEER=1:
# llama-bench -ngl 0 runs the CPU backend). Budget: about 120 s. Prints a row per thread count.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/cpu_compare}
mkdir -p "$OUT"
M=models/tandem-small-q8_0.gguf
echo "model $M ($(stat -c %s $M) bytes); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for t in 4 8; do
  "$BIN/tandem" bench -m "$M" --device cpu -t "$t" -p 512 -n 128 -b 1 -r 3 -o json > "$OUT/tandem_t$t.json" 2> "$OUT/tandem_t$t.err"
  tg=$(python3 -c "
import json,sys
d=json.load(open('$OUT/tandem_t$t.json'))
rows=d if isinstance(d,list) else d.get('results',d.get('rows',[]))
for r in rows:
    if str(r.get('test','')).startswith('tg'): print(r.get('t_s', r.get('tokens_per_s','?'))); break
" 2>/dev/null)
  pp=$(python3 -c "
import json
d=json.load(open('$OUT/tandem_t$t.json'))
rows=d if isinstance(d,list) else d.get('results',d.get('rows',[]))
for r in rows:
    if str(r.get('test','')).startswith('pp'): print(r.get('t_s', r.get('tokens_per_s','?'))); break
" 2>/dev/null)
  peer_tg=NA; peer_pp=NA
  if [ -x "${LLAMA_CPP_BIN:-/nonexistent}/llama-bench" ]; then
    "$LLAMA_CPP_BIN/llama-bench" -m "$M" -ngl 0 -t "$t" -p 512 -n 128 -r 3 -o json > "$OUT/llama_t$t.json" 2> "$OUT/llama_t$t.err"
    peer_tg=$(python3 -c "
import json
for r in json.load(open('$OUT/llama_t$t.json')):
    if r.get('n_gen',0)>0: print(round(r['avg_ts'],1))" 2>/dev/null)
    peer_pp=$(python3 -c "
import json
for r in json.load(open('$OUT/llama_t$t.json')):
    if r.get('n_prompt',0)>0: print(round(r['avg_ts'],1))" 2>/dev/null)
  fi
  echo "threads $t: tandem tg128 ${tg:-?} t/s pp512 ${pp:-?} t/s | llama.cpp tg128 $peer_tg pp512 $peer_pp"
done
head -c 600 "$OUT/tandem_t4.json"; echo
