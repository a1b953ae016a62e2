#!/usr/bin/env bash
# Trains the shipped canvas-diffusion model on the H200 (issue 17 item 7); needs no tandem build, so run_all.sh
# runs it as a background topic: BG_TOPICS="train_diffusion:330". Carry .train (made here by
# scripts/prepare_diffusion_training.sh: the tokenizer directory and a slice of the corpus).
# The trained Hugging Face directory comes back as $FINAL_OUT/diffusion.tar.gz.partNN (<= 15 MiB each).
set -u
OUT=${OUT:-out/train_diffusion}
mkdir -p "$OUT"
[ -f .train/tok/tokenizer.json ] && [ -f .train/train.txt.xz ] || { echo "SKIP: .train not carried"; exit 0; }
export PYTHONUNBUFFERED=1
if python3 models/training/train_diffusion.py --smoke --tokenizer-dir .train/tok --corpus .train/train.txt.xz \
     --out "$OUT/smoke" > "$OUT/smoke.log" 2>&1; then
  echo "PASS smoke run"
else
  echo "FAIL smoke run"; tail -30 "$OUT/smoke.log"; exit 1
fi
python3 models/training/train_diffusion.py --tokenizer-dir .train/tok --corpus .train/train.txt.xz \
  --out "$OUT/train" --deadline-s "${DEADLINE_S:-200}" --batch "${TRAIN_BATCH:-96}" --lr "${TRAIN_LR:-2e-3}" 2>&1 | tee "$OUT/train.log" | tail -25
if ls "$OUT"/train/diffusion.tar.gz.part* > /dev/null 2>&1; then
  mv "$OUT"/train/diffusion.tar.gz.part* "${FINAL_OUT:-$OUT}/"
  echo "PASS trained; pieces in ${FINAL_OUT:-$OUT}"
  rm -rf "$OUT/train/hf" "$OUT/smoke/hf"  # the pieces carry them; the results archive must stay small
else
  echo "FAIL no trained model"
fi
