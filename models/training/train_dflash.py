#!/usr/bin/env python3
"""Trains the small DFlash drafter shipped for models/tandem-small-q8_0.gguf (issue 18).

Self-distillation, no corpus needed: the target (read from its GGUF, Q8_0 dequantized) writes its own training
text: a short sampled prefix (temperature 1, so the contexts vary) followed by its greedy continuation, which
is exactly what greedy speculative decoding has to predict. The drafter (dflash_torch.DFlashDraft: 2 Qwen3
layers of the target's width reading the target's residual stream at taps 1, 3, 5, 7) learns, for random
anchor positions a, to predict tokens a+1 .. a+B-1 from the block [token a, mask x B-1], the injected context
being the target's features of positions < a. Loss: cross-entropy per block slot, weighted exp(-(j-1)/4) (early
slots decide the accepted length). Token embeddings and the head are the target's (frozen, not in the file).

Output: OUT/tandem-small-dflash-q8_0.gguf (matrices Q8_0, norms F32) and OUT/train_dflash.json (losses, the
teacher-forced acceptance estimate). On an H200 the whole run takes --deadline-s (default 200 s); --smoke runs a
few steps on the CPU to check the script.

usage: python3 models/training/train_dflash.py --target models/tandem-small-q8_0.gguf --out OUT [--deadline-s S]
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_torch as dt  # noqa: E402
import qwen3_small  # noqa: E402

TAPS = [1, 3, 5, 7]  # tandem taps = inputs of these target layers (HF hidden_states[i], target_layer_ids i - 1)
BLOCK = 8            # dflash.block_size: the last token + up to 7 drafted
MASK_ID = 8191       # a token the target's embedding has; its embedding is the (frozen) mask


def load_target(path, device):
    meta, t = dt.read_gguf(path)
    a = meta["general.architecture"] + "."
    L = meta[a + "block_count"]
    E = meta[a + "embedding_length"]
    heads = meta[a + "attention.head_count"]
    c = qwen3_small.qwen3_config(
        vocab_size=t["token_embd.weight"].shape[0], hidden=E, layers=L, heads=heads,
        kv_heads=meta.get(a + "attention.head_count_kv", heads),
        head_dim=meta.get(a + "attention.key_length", E // heads), intermediate=meta[a + "feed_forward_length"],
        max_positions=meta[a + "context_length"], bos_id=0, eos_id=0,
        rope_theta=meta.get(a + "rope.freq_base", 10000.0), rms_eps=meta[a + "attention.layer_norm_rms_epsilon"])
    m = qwen3_small.Qwen3Small(c)
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"]}
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(L):
        for g, h in names.items():
            sd["model.layers.%d.%s.weight" % (i, h)] = t["blk.%d.%s.weight" % (i, g)]
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(sd)
    m.to(device).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, c


def target_forward(m, ids):
    """Logits and the taps (inputs of the TAPS layers, concatenated) of ids [B, T]."""
    t = ids.shape[1]
    pos = torch.arange(t, device=ids.device, dtype=torch.float32)
    freqs = torch.outer(pos, m.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x = m.model.embed_tokens(ids)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    taps = []
    for i, layer in enumerate(m.model.layers):
        if i in TAPS:
            taps.append(x)
        x = layer(x, cos, sin)
    if len(m.model.layers) in TAPS:
        taps.append(x)
    return m.lm_head(m.model.norm(x)), torch.cat(taps, dim=-1)


@torch.no_grad()
def make_data(m, n_seq, length, device, gen):
    """Sequences: BOS, a sampled prefix (8..24 tokens, temperature 1), then the target's greedy continuation.
    Returns ids [n_seq, length] and each sequence's prefix length."""
    out, prefix = [], []
    chunk = 1024 if device == "cuda" else 8
    for s0 in range(0, n_seq, chunk):
        b = min(chunk, n_seq - s0)
        ids = torch.zeros(b, 1, dtype=torch.long, device=device)
        plen = torch.randint(8, 25, (b,), generator=gen).to(device)
        for step in range(1, length):
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
                logits = m(ids)[:, -1].float()
            logits[:, MASK_ID] = -float("inf")  # the mask token never appears in the text
            sampled = torch.multinomial(logits.softmax(-1), 1).squeeze(1)
            greedy = logits.argmax(-1)
            nxt = torch.where(step <= plen, sampled, greedy)
            ids = torch.cat([ids, nxt[:, None]], 1)
        out.append(ids.cpu())
        prefix.append(plen.cpu())
    return torch.cat(out), torch.cat(prefix)


def block_batch(ids, prefix, feats, embed, n_anchor, gen, device):
    """The training rows of one batch: anchors a (in the greedy part), block embeddings, positions, mask,
    labels [B, K, BLOCK-1]."""
    bsz, length = ids.shape
    lo = (prefix + 1).clamp(max=length - BLOCK)
    r = torch.rand(bsz, n_anchor, generator=gen)
    a = (lo[:, None] + (r * (length - BLOCK - lo[:, None] + 1)).long()).clamp(max=length - BLOCK)  # [B, K]
    a = a.to(device)
    j = torch.arange(BLOCK, device=device)
    pos = a[:, :, None] + j  # [B, K, BLOCK]
    tok = torch.full((bsz, n_anchor, BLOCK), MASK_ID, dtype=torch.long, device=device)
    ids_d = ids.to(device)
    tok[:, :, 0] = torch.gather(ids_d, 1, a)
    labels = torch.gather(ids_d, 1, pos[:, :, 1:].reshape(bsz, -1)).view(bsz, n_anchor, BLOCK - 1)
    noise = embed(tok.view(bsz, -1))
    q_pos = pos.view(bsz, -1)
    ctx_pos = torch.arange(length, device=device)[None].expand(bsz, length)
    # Block k sees context positions < a_k and its own rows.
    a_rows = q_pos - (torch.arange(n_anchor * BLOCK, device=device) % BLOCK)[None]  # a_k of each row
    ctx_vis = ctx_pos[:, None, :] < a_rows[:, :, None]
    blk = torch.arange(n_anchor * BLOCK, device=device) // BLOCK
    blk_vis = (blk[:, None] == blk[None, :])[None].expand(bsz, -1, -1)
    mask = torch.cat([ctx_vis, blk_vis], dim=2)[:, None]
    return noise, q_pos, ctx_pos, mask, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/tandem-small-q8_0.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=200.0)
    ap.add_argument("--smoke", action="store_true", help="tiny run on the CPU (checks the script)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t_start = time.time()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    m, tc = load_target(args.target, device)
    E = tc["hidden_size"]
    c = {"hidden_size": E, "layers": args.layers, "heads": tc["num_attention_heads"],
         "kv_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"], "ffn": args.ffn,
         "rms_eps": tc["rms_norm_eps"], "rope_theta": tc["rope_theta"], "n_taps": len(TAPS)}
    n_seq, length = (16, 48) if args.smoke else (2048, 160)
    data, prefix = make_data(m, n_seq, length, device, gen)
    n_eval = max(2, n_seq // 16)
    print("data: %d sequences of %d tokens in %.1f s" % (n_seq, length, time.time() - t_start), flush=True)

    d = dt.DFlashDraft(c).to(device)
    for p in d.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(d.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01)
    bsz, n_anchor = (4, 4) if args.smoke else (64, 16)
    w = torch.exp(-torch.arange(BLOCK - 1, dtype=torch.float32, device=device) / 4.0)
    w = w / w.sum()
    train_ids, train_prefix = data[n_eval:], prefix[n_eval:]
    budget = args.deadline_s - (time.time() - t_start) - (10 if not args.smoke else 0)
    max_steps = 3 if args.smoke else 100000
    t0 = time.time()
    step, losses = 0, []
    est_steps = None
    while step < max_steps:
        el = time.time() - t0
        if el > budget:
            break
        if step == 20 and est_steps is None:
            est_steps = int(budget / (el / 20))
        sel = torch.randint(0, train_ids.shape[0], (bsz,), generator=gen)
        ids, pre = train_ids[sel], train_prefix[sel]
        with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            _, feats = target_forward(m, ids.to(device))
        noise, q_pos, ctx_pos, mask, labels = block_batch(ids, pre, feats, m.model.embed_tokens, n_anchor, gen, device)
        # lr: warm-up 50 steps, cosine to 10% over the estimated run
        total = est_steps or 2000
        lr = 2e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            # The drafter's own output norm (inside d), then the target's head.
            logits = m.lm_head(d(noise, feats, q_pos, ctx_pos, mask))
        logits = logits.float().view(bsz, n_anchor, BLOCK, -1)[:, :, 1:]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        loss = (ce.view(bsz, n_anchor, BLOCK - 1) * w).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        if step % 100 == 0:
            print("step %d loss %.4f lr %.2e (%.0f s)" % (step, float(loss), lr, time.time() - t0), flush=True)
        step += 1

    # Teacher-forced acceptance on held-out sequences: consecutive correct slots from slot 1, plus one.
    d.eval()
    acc_len, per_slot, n_blocks = 0.0, np.zeros(BLOCK - 1), 0
    with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        ids, pre = data[:n_eval], prefix[:n_eval]
        _, feats = target_forward(m, ids.to(device))
        noise, q_pos, ctx_pos, mask, labels = block_batch(ids, pre, feats, m.model.embed_tokens, n_anchor, gen, device)
        pred = m.lm_head(d(noise, feats, q_pos, ctx_pos, mask)).float().argmax(-1).view(len(ids), n_anchor, BLOCK)[:, :, 1:]
        ok = (pred == labels).cpu().numpy()
        run = np.cumprod(ok, axis=-1)
        acc_len = float(run.sum(-1).mean() + 1.0)
        per_slot = run.mean(axis=(0, 1))
        n_blocks = int(run.shape[0] * run.shape[1])
    res = {"steps": step, "final_loss": float(np.mean(losses[-50:])) if losses else None,
           "eval_blocks": n_blocks, "teacher_forced_mean_accepted_length": acc_len,
           "per_slot_acceptance": [float(x) for x in per_slot], "seconds": time.time() - t_start,
           "config": c, "taps": TAPS, "block_size": BLOCK, "mask_token_id": MASK_ID, "device": device}
    print(json.dumps(res, indent=1), flush=True)
    d.cpu()
    name = "tandem-small-dflash-smoke.gguf" if args.smoke else "tandem-small-dflash-q8_0.gguf"
    meta = dt.drafter_gguf_meta(c, TAPS, BLOCK, MASK_ID, tc["max_position_embeddings"], "tandem-small-dflash")
    dt.write_gguf(os.path.join(args.out, name), meta, dt.drafter_gguf_tensors(d))
    with open(os.path.join(args.out, "train_dflash.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("wrote %s in %.1f s" % (os.path.join(args.out, name), time.time() - t_start), flush=True)


if __name__ == "__main__":
    main()
