#!/usr/bin/env bash
# gemma4 26B-A4B speed on the H200 (issue 16): random-weight GGUFs of the 26B-A4B shape (LAYERS of its 30 layers,
# default 4, so that the whole script fits in 120 s; the vocab-262144 head is whole: 128 experts of n_ff 704, top 8, beside the dense MLP; scripts/device/gemma4_moe_template.py, then
# `tandem bench --random-weights` for bf16 and q4_k_m) and `tandem bench` tg128 at batch 1 and pp512 on cuda:0.
# tandem's report prints the weights a batch-1 decode step reads (the used experts only: 8/128 of every expert
# tensor, plus everything else) and the tg fraction of 4.28 TB/s (--bw 4280) computed on those bytes. When
# LLAMA_CPP_BIN has llama-bench (run_all.sh runs your PEER_BUILD), the same files run there too (-ngl 99
# -fa 1), for the side-by-side rows of bench/BENCHMARKS.md.
# Note: q4_k_m here is tandem quantize's mix; tensors whose row length is not a multiple of 256 (ffn_down_exps
# 704, ffn_down 2112) fall back to q8_0, as `tandem quantize` does. Both engines read the same file.
# $OUT/summary.txt: per type tandem vs llama.cpp t/s (tg128, pp512), their ratio, and each engine's tg as a
# fraction of the bandwidth limit on the active bytes (tandem's "decode step reads" line; llama.cpp reads the
# same file). Per-step figures are for LAYERS layers: not scaled to 30 (the ratio to the limit is what carries).
# PROFILE=1: the first bench also prints the per-kernel table of its tg steps (tandem bench --profile; those
# t/s are profiled, slower), and a PDL-off profile run follows (per-kernel times without the launch-early wait).
# AB_SWITCHES="VAR=1,VAR2=1 VAR3=1": one more tg128 run per set of switches, beside the default row (with
# PROFILE, its kernel count and busy/idle line too).
# Usage: BIN=build-gpu/bin OUT=<dir> [LAYERS=4] [TYPES="bf16 q4_k_m"] [PROFILE=1] scripts/device/gemma4_moe_bench.sh. Budget:
# about 110 s for 4 layers (bf16 ~8 GB and q4_k_m ~3 GB of random weights written in seconds; each engine's
# runs <= 45 s); a type is skipped (said so) when less than 50 s of BUDGET (default 115) is left.
set -uo pipefail
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-/tmp/gemma4_moe_bench_out}
[ "${PROFILE:-}" = 0 ] && unset PROFILE  # (PROFILE=0 meant "on" before: the tests below ask only whether it is set)
LAYERS=${LAYERS:-4}
mkdir -p "$OUT"
status=0
TMPL=/tmp/gemma4_26b_a4b_template.gguf
python3 scripts/device/gemma4_moe_template.py "$TMPL" --layers "$LAYERS" || { echo "FAIL template"; exit 1; }
BUDGET=${BUDGET:-115}  # seconds for the whole script (raise it with PROFILE or AB_SWITCHES)
# G4_DIR: where the random-weight files go (/tmp by default; all 30 layers in bf16 are ~50 GB: /dev/shm holds
# them where the disk is short). G4_TIMEOUT: seconds for each engine's bench run (45; give 90 at 30 layers).
G4_DIR=${G4_DIR:-/tmp}
G4_TIMEOUT=${G4_TIMEOUT:-45}
for t in ${TYPES:-bf16 q4_k_m}; do
  if [ $((BUDGET - SECONDS)) -lt 50 ]; then echo "SKIPPED $t: $((BUDGET - SECONDS)) s of the budget left"; continue; fi
  f=$G4_DIR/gemma4_26b_a4b_$t.gguf
  t0=$SECONDS
  if ! "$BIN/tandem" bench -m "$TMPL" --random-weights "$t" --to "$f" >"$OUT/make_$t.txt" 2>&1; then
    echo "FAIL make_$t"; tail -5 "$OUT/make_$t.txt"; status=1; continue
  fi
  echo "made $f ($(du -h "$f" | cut -f1)) in $((SECONDS - t0)) s"
  t0=$SECONDS
  if timeout "$G4_TIMEOUT" "$BIN/tandem" bench -m "$f" -p 512 -n 128 -b 1 -r 2 --device cuda:0 --bw 4280 \
      ${PROFILE:+--profile} >"$OUT/bench_$t.txt" 2>&1; then
    echo "PASS bench_$t ($((SECONDS - t0)) s)"
  else
    echo "FAIL bench_$t ($((SECONDS - t0)) s)"; status=1
  fi
  grep -E "model:|shape:|decode step reads|limits:|^\| (pp|tg)" "$OUT/bench_$t.txt"
  [ -n "${PROFILE:-}" ] && grep -A26 -E "^## Kernels of" "$OUT/bench_$t.txt" | grep -v "^$"
  tail -3 "$OUT/bench_$t.txt" | grep -iE "error|fail" && status=1
  if [ -n "${PROFILE:-}" ]; then  # per-kernel times with PDL off (with PDL on a kernel's time includes its wait)
    TANDEM_PDL=0 timeout 45 "$BIN/tandem" bench -m "$f" -p 0 -n 32 -b 1 -r 1 --device cuda:0 --bw 4280 --profile \
      >"$OUT/profile_pdl0_$t.txt" 2>&1
    echo "profile TANDEM_PDL=0 $t rc=$?:"; grep -A40 -E "^## Kernels of" "$OUT/profile_pdl0_$t.txt" | grep -v "^$"
  fi
  for sw in ${AB_SWITCHES:-}; do  # A/B: tg128 with a set of switches (VAR=1,VAR2=1), beside the default row above
    name=${sw//[=,]/_}
    env ${sw//,/ } timeout 45 "$BIN/tandem" bench -m "$f" -p 0 -n 128 -b 1 -r 2 --device cuda:0 --bw 4280 \
      ${PROFILE:+--profile} >"$OUT/bench_${t}_$name.txt" 2>&1
    echo "$sw rc=$?: $(grep -E "^\| tg128" "$OUT/bench_${t}_$name.txt")"
    [ -n "${PROFILE:-}" ] && grep -E "kernels busy|^## Kernels of" "$OUT/bench_${t}_$name.txt"
  done
  if [ "$t" != bf16 ] && [ "${G4_ID_AB:-1}" = 1 ]; then  # (G4_ID_AB=0 skips it) the staged routed kernel (TANDEM_ID_DIRECT=0; the direct one is the default): tg128 beside
    TANDEM_ID_DIRECT=0 timeout 45 "$BIN/tandem" bench -m "$f" -p 0 -n 128 -b 1 -r 2 --device cuda:0 --bw 4280 \
      >"$OUT/bench_${t}_id_staged.txt" 2>&1
    echo "TANDEM_ID_DIRECT=0 rc=$?: $(grep -E "^\| tg128" "$OUT/bench_${t}_id_staged.txt")"
  fi
  if [ -n "${LLAMA_CPP_BIN:-}" ] && [ -x "$LLAMA_CPP_BIN/llama-bench" ]; then
    t0=$SECONDS
    timeout "$G4_TIMEOUT" "$LLAMA_CPP_BIN/llama-bench" -m "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 >"$OUT/llama_bench_$t.txt" 2>&1
    echo "llama-bench $t rc=$? ($((SECONDS - t0)) s):"
    grep -E "^\|" "$OUT/llama_bench_$t.txt" | tail -4
  else
    echo "llama-bench: LLAMA_CPP_BIN not set or no llama-bench there (a built llama.cpp; run_all.sh runs your PEER_BUILD)"
  fi
  rm -f "$f"
done
rm -f "$TMPL"
# Side by side: t/s of both engines, their ratio, and tg as a fraction of the bandwidth limit on active bytes.
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
for t in ("bf16", "q4_k_m"):
    tb, lb = out / f"bench_{t}.txt", out / f"llama_bench_{t}.txt"
    if not tb.exists():
        print(f"{t}: no tandem bench output"); continue
    txt = tb.read_text()
    m = re.search(r"decode step reads: ([0-9.]+) GiB.*?limit ([0-9.]+) steps/s", txt)
    gib, lim = (float(m.group(1)), float(m.group(2))) if m else (float("nan"), float("nan"))
    ours = {r[0]: float(r[1]) for r in re.findall(r"^\| (pp512|tg128) \| 1 \| ([0-9.]+) \|", txt, re.M)}
    peer = {}
    if lb.exists():
        for test, tps in re.findall(r"\|\s*(pp512|tg128)\s*\|\s*([0-9.]+) ±", lb.read_text()):
            peer[test] = float(tps)
    print(f"{t}: active bytes per decode step {gib:.3f} GiB, bandwidth limit {lim:.1f} steps/s")
    for test in ("tg128", "pp512"):
        a, b = ours.get(test), peer.get(test)
        line = f"  {test}: tandem {a if a is not None else 'n/a'} t/s, llama.cpp {b if b is not None else 'n/a'} t/s"
        if a and b:
            line += f", tandem/llama.cpp {a / b:.2f}x"
        if test == "tg128" and lim == lim:
            line += (f"; of the limit: tandem {100 * a / lim:.1f}%" if a else "") + \
                    (f", llama.cpp {100 * b / lim:.1f}%" if b else "")
        print(line)
PY
echo "gemma4_moe_bench device script: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
