#!/usr/bin/env bash
# Makes .train/ (git-ignored) for scripts/device/train_diffusion.sh: the small models' vocabulary plus <|mask|>
# as a Hugging Face tokenizer directory, and the first MB of the training corpus (make_corpus.py's output).
#   bash scripts/prepare_diffusion_training.sh [CORPUS_DIR] [MB]
set -euo pipefail
corpus=${1:-models/training/corpus}
mb=${2:-40}
mkdir -p .train
python3 models/training/gguf_tokenizer_to_hf.py models/tandem-small-q8_0.gguf .train/tok --add-special "<|mask|>"
xz -dc "$corpus/train.txt.xz" | head -c "$((mb * 1000000))" | xz -6 -T2 > .train/train.txt.xz
ls -la .train .train/tok
