#!/usr/bin/env bash
# The shipped-candidate canvas model end to end on the H200 (issue 17): `tandem diffuse` with the device path
# (SC on the GPU, the EB reduction on the GPU) and with the host paths, on cuda:0 and on the CPU; the canvas
# model file comes in .dmodel/ (git-ignored, carried). Budget: about 60 s.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/diffuse_demo}
mkdir -p "$OUT"
M=$(ls .dmodel/*.gguf 2>/dev/null | head -1)
[ -n "$M" ] || { echo "SKIP diffuse_demo: no .dmodel/*.gguf carried"; exit 0; }
run() {  # name, then flags
  local name=$1; shift
  timeout 60 "$BIN/tandem" diffuse -m "$M" -p "The Python interpreter" -n 64 --seed 3 --ids --no-chat-template "$@" \
    >"$OUT/$name.ids" 2>"$OUT/$name.err"
  echo "$name rc=$? $(tail -1 "$OUT/$name.err" | cut -c1-160)"
}
run cuda_device --devices cuda:0
run cuda_host --devices cuda:0 --diffusion-gpu-sampling off --diffusion-gpu-sample-reduce off
run cuda_unified --devices cuda:0 --diffusion-kv-cache off
run cpu --device cpu
for n in cuda_host cuda_unified cpu; do
  if cmp -s "$OUT/cuda_device.ids" "$OUT/$n.ids"; then echo "SAME ids: cuda_device vs $n"; else echo "DIFFERENT ids: cuda_device vs $n"; fi
done
head -c 400 "$OUT/cuda_device.ids"; echo
grep -h -i "path\|canvas\|steps/s" "$OUT"/cuda_device.err | head -5
