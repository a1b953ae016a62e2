#!/usr/bin/env bash
# Makes .train/ (git-ignored) for scripts/device/train_diffusion.sh: the small models' vocabulary plus <|mask|>
# as a Hugging Face tokenizer directory, and a slice of about MB megabytes of the training corpus (make_corpus.py's
# output).
#   bash scripts/prepare_diffusion_training.sh [CORPUS_DIR] [MB]
set -euo pipefail
corpus=${1:-models/training/corpus}
mb=${2:-40}
mkdir -p .train
python3 models/training/gguf_tokenizer_to_hf.py models/tandem-small-q8_0.gguf .train/tok --add-special "<|mask|>"
# Every k-th page, so that every source of the corpus is in the slice (the file is ordered by source).
python3 - "$corpus/train.txt.xz" "$mb" <<'PY'
import lzma, sys
sep = "\n\x1e\n"
pages = lzma.open(sys.argv[1], "rt", encoding="utf-8").read().split(sep)
total = sum(len(p) for p in pages)
k = max(1, round(total / (float(sys.argv[2]) * 1e6)))
kept = pages[::k]
with lzma.open(".train/train.txt.xz", "wt", encoding="utf-8", preset=6) as f:
    f.write(sep.join(kept))
print("kept %d of %d pages (every %d-th), %.1f MB" % (len(kept), len(pages), k, sum(len(p) for p in kept) / 1e6))
PY
ls -la .train .train/tok
