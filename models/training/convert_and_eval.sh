#!/bin/bash
# Second half of the recipe, on any machine (CPU only): reassemble what run_on_gpu.sh returned, convert both
# Hugging Face directories with `tandem convert`, quantize, and measure tandem's perplexity of the held-out
# evaluation text for f32, Q8_0 and Q4_K (compare with PyTorch's figure in results.json).
#
#   bash models/training/convert_and_eval.sh GPU_OUT_DIR [TANDEM_BINARY]
#
# Writes models/training/work/{hf,gguf}/ and prints the figures; copies the shipped files into models/.
set -euo pipefail
IN=${1:?usage: convert_and_eval.sh GPU_OUT_DIR [TANDEM_BINARY]}
TANDEM=${2:-build/bin/tandem}
W=models/training/work
EVAL=models/eval/heldout_eval.txt
mkdir -p "$W/hf" "$W/gguf"

cat "$IN"/models.tar.gz.part* > "$W/models.tar.gz"
(cd "$W" && sha256sum -c "$IN/models.sha256")
tar -C "$W/hf" -xzf "$W/models.tar.gz"

"$TANDEM" convert "$W/hf/main" -o "$W/gguf/tandem-small-f32.gguf" --type f32 --name tandem-small -q
"$TANDEM" convert "$W/hf/draft" -o "$W/gguf/tandem-draft-f32.gguf" --type f32 --name tandem-draft -q
for t in q8_0 q4_k; do
  "$TANDEM" quantize "$W/gguf/tandem-small-f32.gguf" "$W/gguf/tandem-small-$t.gguf" "$t" -q
done
"$TANDEM" quantize "$W/gguf/tandem-draft-f32.gguf" "$W/gguf/tandem-draft-q8_0.gguf" q8_0 -q

cp "$W/gguf/tandem-small-q8_0.gguf" "$W/gguf/tandem-draft-q8_0.gguf" models/
python3 - "$IN/results.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for name in ("main", "draft"):
    p = r[name]["ppl"]
    print("PyTorch %-5s: PPL = %.4f +/- %.5f (%d tokens, ctx %d)" % (name, p["ppl"], p["ppl_err"], p["tokens_scored"], p["ctx"]))
EOF
for g in tandem-small-f32 tandem-small-q8_0 tandem-small-q4_k tandem-draft-f32 tandem-draft-q8_0; do
  printf '%-20s ' "$g"
  "$TANDEM" perplexity -m "$W/gguf/$g.gguf" -f "$EVAL" --ctx 512 --no-progress 2>/dev/null
done
