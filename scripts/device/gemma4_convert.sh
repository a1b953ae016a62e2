#!/usr/bin/env bash
# Interop check for `tandem convert` of Gemma 4 (issue 16 part B): builds a random tiny Gemma4ForCausalLM
# checkpoint with transformers (dense with global KV heads, and MoE), converts it with llama.cpp's
# convert_hf_to_gguf.py and with `tandem convert` (both --outtype f32), and diffs every gemma4.* key and every
# tensor (names, shapes, dtypes, values) with tests/reference/gemma4_convert_diff.py --diff (gguf-py); tokenizer.* keys
# that differ are listed (INFO), not counted. The same comparison without transformers runs on the CPU: that file.
# The checkpoint has the Gemma-style tokenizer of tests/reference/gemma_tokenizer_json.py (llama.cpp's converter
# accepts no other kind for Gemma 4). Env: LLAMA_CPP_SRC (llama.cpp source tree), BIN (tandem binaries), OUT (results).
# Budget: about 90 s. Prints PASS/FAIL per variant and a summary; results in $OUT/gemma4_convert_*.txt.
set -u
BIN=${BIN:-build-gpu/bin}
OUT=${OUT:-out/gemma4_convert}
mkdir -p "$OUT"
if [ -z "${LLAMA_CPP_SRC:-}" ] || [ ! -f "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" ]; then
  echo "FAIL: LLAMA_CPP_SRC is not set to a llama.cpp tree with convert_hf_to_gguf.py" | tee "$OUT/gemma4_convert_summary.txt"
  exit 1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$LLAMA_CPP_SRC/gguf-py:${PYTHONPATH:-}"
fail=0
for variant in dense moe; do
  dir="$WORK/$variant"
  python3 - "$dir" "$variant" <<'PY' >"$OUT/gemma4_convert_${variant}_build.txt" 2>&1
import os, sys, torch
sys.path.insert(0, "tests/reference")
from gemma_tokenizer_json import write_gemma_tokenizer
from transformers import Gemma4TextConfig, Gemma4ForCausalLM
d, variant = sys.argv[1], sys.argv[2]
# The Gemma-style tokenizer (BPE with byte fallback) llama.cpp's Gemma4 converter requires (gguf.LlamaHfVocab);
# the model's vocabulary is exactly the tokenizer's.
tok = write_gemma_tokenizer(d)
torch.manual_seed(0)
kw = dict(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=256, num_hidden_layers=4,
          num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=128,
          num_global_key_value_heads=1, sliding_window=16, max_position_embeddings=4096,
          layer_types=["sliding_attention"] * 3 + ["full_attention"])
if variant == "moe":
    kw.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=256)
cfg = Gemma4TextConfig(**kw)
m = Gemma4ForCausalLM(cfg).eval()
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.5)
m.save_pretrained(d, safe_serialization=True)
print("built", variant, sorted(os.listdir(d)))
PY
  [ $? -eq 0 ] || { echo "FAIL $variant: building the checkpoint (see gemma4_convert_${variant}_build.txt)"; fail=1; continue; }
  timeout 60 python3 "$LLAMA_CPP_SRC/convert_hf_to_gguf.py" "$dir" --outtype f32 --outfile "$WORK/$variant.ref.gguf" \
    >"$OUT/gemma4_convert_${variant}_llamacpp.txt" 2>&1 || { echo "FAIL $variant: llama.cpp convert:"; tail -5 "$OUT/gemma4_convert_${variant}_llamacpp.txt"; fail=1; continue; }
  timeout 60 "$BIN/tandem" convert "$dir" -o "$WORK/$variant.tandem.gguf" --type f32 \
    >"$OUT/gemma4_convert_${variant}_tandem.txt" 2>&1 || { echo "FAIL $variant: tandem convert (see log)"; fail=1; continue; }
  # --trimmed-rows: transformers gives the checkpoint vocab_size_per_layer_input = 262144 rows of per-layer
  # embeddings; tandem trims them to the tokenizer's count, llama.cpp does not (gemma4_convert_diff.py's TRIMMED).
  python3 tests/reference/gemma4_convert_diff.py --llama-src "$LLAMA_CPP_SRC" --trimmed-rows --diff "$WORK/$variant.ref.gguf" \
    "$WORK/$variant.tandem.gguf" >"$OUT/gemma4_convert_${variant}_diff.txt" 2>&1
  if [ $? -eq 0 ]; then echo "PASS $variant: keys and tensors equal"; else
    echo "FAIL $variant: first differences (all in gemma4_convert_${variant}_diff.txt):"
    grep -v '^INFO' "$OUT/gemma4_convert_${variant}_diff.txt" | head -12 | cut -c1-300; fail=1; fi
  grep '^INFO' "$OUT/gemma4_convert_${variant}_diff.txt" | head -4 | cut -c1-200
done | tee "$OUT/gemma4_convert_summary.txt"
grep -q FAIL "$OUT/gemma4_convert_summary.txt" && { echo "gemma4_convert: FAIL"; exit 1; }
echo "gemma4_convert: PASS"
