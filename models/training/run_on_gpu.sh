#!/bin/bash
# The training recipe as one command on a GPU machine (PyTorch, transformers and tokenizers installed), from the
# repository root, with the corpus made by make_corpus.py in models/training/corpus/:
#
#   bash models/training/run_on_gpu.sh            # results in $OUT, or models/training/work/gpu-out
#
# It trains (train.py), then packs the two Hugging Face directories (bf16 safetensors + tokenizer) into
# models.tar.gz cut into 15 MiB pieces (the transfer back accepts files of at most 16 MiB). Reassemble and
# convert on any machine with tandem built:
#
#   cat models.tar.gz.part* > models.tar.gz && sha256sum -c models.sha256 && tar xzf models.tar.gz
#   tandem convert main -o tandem-small-f32.gguf --type f32 ...   (models/README.md lists every step)
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/models/training/work/gpu-out}
WORK=${WORK:-/tmp/tandem-train}
mkdir -p "$OUT" "$WORK"
test -f models/training/corpus/train.txt.xz || { echo "corpus missing: run models/training/make_corpus.py" >&2; exit 1; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "${PYTHON:-python3}" models/training/train.py --out "$WORK" --deadline-s "${DEADLINE_S:-400}" "$@"
  cp "$WORK/results.json" "$OUT/"
  tar -C "$WORK" -cf - main draft | gzip -1 > "$WORK/models.tar.gz"
  (cd "$WORK" && sha256sum models.tar.gz) > "$OUT/models.sha256"
  split -b 15M -d "$WORK/models.tar.gz" "$OUT/models.tar.gz.part"
  ls -l "$OUT"
  date -u
} 2>&1 | tee "$OUT/train_stdout.txt"
