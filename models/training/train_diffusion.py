#!/usr/bin/env python3
"""Trains tandem's shipped small canvas-diffusion model: a DiffusionGemma (transformers'
DiffusionGemmaForBlockDiffusion: gemma4 layers with the dense MLP and a mixture of experts in every layer, a
prompt encoder sharing the decoder's weights, self-conditioning) on the corpus and vocabulary of the small
autoregressive models, so `tandem diffuse -p "..."` works on a CPU with no download.

On the GPU machine (PyTorch 2.x, transformers >= 5.17 with DiffusionGemma, tokenizers):

  python3 models/training/train_diffusion.py --tokenizer-dir TOKDIR --corpus train.txt.xz --out DIR

TOKDIR comes from `gguf_tokenizer_to_hf.py models/tandem-small-q8_0.gguf TOKDIR --add-special "<|mask|>"` (the
small models' 8192 tokens plus a mask token: DiffusionGemma files name one, though the sampler starts from
random tokens, not masks).

The objective is the one the EB sampler undoes (GGUF-ARCH-FACTS D.6): a window of text is cut into a prompt of
random length and a canvas of `canvas_length` tokens; every canvas token is replaced, with probability t ~ U(0,1)
per example, by a uniformly random token; the model predicts every original canvas token (cross-entropy over the
whole canvas). Self-conditioning as in training of self-conditioned diffusion models: for half of the examples
a first pass without gradients gives logits that the second pass reads as self_conditioning_logits.

Writes DIR/hf (config.json, generation_config.json, model.safetensors without the vision tower, tokenizer
files), DIR/results.json (loss curve, held-out loss, a few generations by transformers' own sampler), and
DIR/diffusion.tar.gz.partNN pieces of the hf directory (the device transfer takes files <= 16 MiB).
--smoke runs three steps of a tiny config (a quick check that the code path works on this transformers).
"""

import argparse
import json
import lzma
import math
import os
import random
import shutil
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

RECORD_SEP = "\n\x1e\n"
EOT_ID = 0

SHAPE = dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, global_head_dim=128, intermediate=768,
             experts=4, top_k=2, expert_intermediate=256, sliding_window=128)
SMOKE = dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, global_head_dim=64, intermediate=128,
             experts=2, top_k=1, expert_intermediate=64, sliding_window=32)
PROMPTS = ["The Python interpreter", "A dictionary is", "To install a package on Debian,", "Love, n."]


def log(*msg):
    print("[%7.1fs] %s" % (time.time() - T0, " ".join(str(m) for m in msg)), flush=True)


def build_model(vocab, canvas, shape):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    n = shape["layers"]
    text = dict(vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                num_hidden_layers=n, num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                head_dim=shape["head_dim"], global_head_dim=shape["global_head_dim"],
                sliding_window=shape["sliding_window"], max_position_embeddings=4096,
                layer_types=["sliding_attention"] * (n - 1) + ["full_attention"],
                num_experts=shape["experts"], top_k_experts=shape["top_k"],
                moe_intermediate_size=shape["expert_intermediate"],
                bos_token_id=EOT_ID, eos_token_id=EOT_ID, pad_token_id=EOT_ID, tie_word_embeddings=True)
    # transformers 5.17 builds the vision tower unconditionally: give it the smallest vision config (its
    # tensors are dropped before saving; tandem's converter drops vision tensors anyway).
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas)
    return DiffusionGemmaForBlockDiffusion(cfg)


def load_tokens(tok, corpus, max_bytes):
    with lzma.open(corpus, "rt", encoding="utf-8") as f:
        text = f.read(max_bytes)
    pages = [p for p in text.split(RECORD_SEP) if p.strip()]
    ids = []
    enc = tok.encode_batch_fast if hasattr(tok, "encode_batch_fast") else tok.encode_batch
    for e in enc(pages, add_special_tokens=False):
        ids.append(EOT_ID)
        ids.extend(e.ids)
    return torch.tensor(ids, dtype=torch.long)


def batch(stream, n, prompt_len, canvas, vocab_text, gen):
    starts = torch.randint(0, stream.numel() - prompt_len - canvas - 1, (n,), generator=gen)
    win = torch.stack([stream[s:s + prompt_len + canvas] for s in starts.tolist()])
    prompt = win[:, :prompt_len].clone()
    prompt[:, 0] = EOT_ID  # tandem adds BOS (= EOT) in front of every prompt
    target = win[:, prompt_len:]
    t = torch.rand(n, 1, generator=gen)
    noise = torch.rand(n, canvas, generator=gen) < t
    random_ids = torch.randint(0, vocab_text, (n, canvas), generator=gen)
    return prompt, torch.where(noise, random_ids, target), target


def loss_of(model, prompt, noisy, target, sc_mask):
    sc_logits = None
    if sc_mask is not None and bool(sc_mask.any()):
        with torch.no_grad():
            sc_logits = model(input_ids=prompt, decoder_input_ids=noisy, use_cache=True).logits.float()
    out = model(input_ids=prompt, decoder_input_ids=noisy, self_conditioning_logits=sc_logits,
                self_conditioning_mask=sc_mask if sc_logits is not None else None, use_cache=True)
    return F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), target.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=180)
    ap.add_argument("--max-mb", type=float, default=40)
    ap.add_argument("--canvas", type=int, default=32)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    vocab_text = vocab - 1  # the last id is <|mask|>: never a noise token
    shape = SMOKE if args.smoke else SHAPE
    stream = load_tokens(tok, args.corpus, int((0.2 if args.smoke else args.max_mb) * 1e6))
    n_held = max(stream.numel() // 100, 4096)
    held, train = stream[:n_held], stream[n_held:]
    log("tokens: train %d, held-out %d, vocab %d" % (train.numel(), held.numel(), vocab))

    model = build_model(vocab, args.canvas, shape).to(dev)
    model.train()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    log("model: %.2fM parameters (without the vision tower)" % (n_params / 1e6))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    gen = torch.Generator().manual_seed(1)
    held_gen = torch.Generator().manual_seed(2)
    held_batches = [batch(held, 32, 48, args.canvas, vocab_text, held_gen) for _ in range(4)]
    deadline = 3 if args.smoke else args.deadline_s
    warmup = 2 if args.smoke else 100
    t_start, step, curve = time.time(), 0, []

    def held_loss():
        model.eval()
        with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            ls = [loss_of(model, p.to(dev), x.to(dev), y.to(dev), None).item() for p, x, y in held_batches]
        model.train()
        return sum(ls) / len(ls)

    while True:
        elapsed = time.time() - t_start
        if (args.smoke and step == 3) or (not args.smoke and elapsed > deadline):
            break
        frac = min(1.0, elapsed / deadline)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        prompt_len = random.randint(8, 96)
        p, x, y = (v.to(dev) for v in batch(train, args.batch, prompt_len, args.canvas, vocab_text, gen))
        sc_mask = (torch.rand(args.batch, generator=gen) < 0.5).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss = loss_of(model, p, x, y, sc_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or args.smoke:
            curve.append({"step": step, "time": round(elapsed, 1), "loss": loss.item(), "lr": lr})
            log("step %d loss %.4f lr %.2e" % (step, loss.item(), lr))
        if step % 500 == 0:
            curve[-1]["held_loss"] = held_loss()
            log("held-out loss %.4f" % curve[-1]["held_loss"])
    final_held = held_loss()
    log("done: %d steps, held-out loss %.4f" % (step, final_held))

    results = {"shape": shape, "canvas": args.canvas, "steps": step, "params": n_params, "held_loss": final_held,
               "curve": curve, "samples": []}
    model.eval()
    for prompt in PROMPTS:
        ids = torch.tensor([[EOT_ID] + tok.encode(prompt, add_special_tokens=False).ids], device=dev)
        try:
            out = model.generate(input_ids=ids, max_new_tokens=args.canvas)
            seq = out.sequences if hasattr(out, "sequences") else out
            new = seq[0].tolist()
            results["samples"].append({"prompt": prompt, "ids": new, "text": tok.decode(new)})
            log("sample:", repr(prompt), "->", repr(tok.decode(new))[:200])
        except Exception as e:  # noqa: BLE001 -- the sampler API is informative only; the weights are the product
            results["samples"].append({"prompt": prompt, "error": repr(e)})
            log("generate failed:", repr(e))

    hf = os.path.join(args.out, "hf")
    os.makedirs(hf, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(hf, safe_serialization=True)
    from safetensors.torch import load_file, save_file
    for name in os.listdir(hf):
        if name.endswith(".safetensors"):
            path = os.path.join(hf, name)
            tensors = load_file(path)
            kept = {k: v for k, v in tensors.items() if "vision" not in k}
            log("%s: kept %d of %d tensors (vision tower dropped)" % (name, len(kept), len(tensors)))
            save_file(kept, path, metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer_dir, name), hf)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    tar = os.path.join(args.out, "diffusion.tar.gz")
    subprocess.run(["tar", "czf", tar, "-C", args.out, "hf"], check=True)
    subprocess.run(["split", "-b", "15M", "-d", tar, tar + ".part"], check=True)
    os.remove(tar)
    log("wrote", args.out)


if __name__ == "__main__":
    T0 = time.time()
    main()
