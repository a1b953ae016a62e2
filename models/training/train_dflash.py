#!/usr/bin/env python3
"""Trains the small DFlash drafter shipped for models/tandem-small-q8_0.gguf (issue 18).

Self-distillation: the target (read from its GGUF, Q8_0 dequantized, run in f32 with a KV cache) writes the
training text: a prompt of 1..48 tokens (BOS, then either a window of real text, --text-ids, or tokens the
target samples at temperature 1) followed by its greedy continuation, which is exactly what greedy
speculative decoding has to predict. The drafter (dflash_torch.DFlashDraft: 2 Qwen3 layers of the target's
width reading the target's residual stream at taps 1, 3, 5, 7) learns, for random anchor positions a from the
last prompt token on, to predict tokens a+1 .. a+B-1 from the block [token a, mask x B-1], the injected context
being the target's features of positions < a. Loss: cross-entropy per block slot, weighted exp(-(j-1)/4)
(early slots decide the accepted length). Token embeddings and the head are the target's (frozen, not in the
file).

Why real text and many short prompts: the first drafter (2048 continuations of sampled 8..24-token prefixes,
every anchor seen ~15 times) memorised the few greedy attractors of those texts: 2.86 teacher-forced on
held-out continuations of the same kind, but 1.1 in tandem on prompts of real text or hand-written ids, where
it had to read the context instead. Held-out evaluation here therefore uses prompts the drafter never saw: the
last 15% of the --text-ids text, and the prompts of tandem's CI tests (reported on their own).

Output: OUT/tandem-small-dflash-q8_0.gguf (matrices Q8_0, norms F32) and OUT/train_dflash.json (losses, the
teacher-forced acceptance estimates). On an H200 the whole run takes --deadline-s (default 200 s); --smoke runs
a few steps on the CPU to check the script.

usage: python3 models/training/train_dflash.py --target models/tandem-small-q8_0.gguf --out OUT
         [--text-ids IDS.txt] [--deadline-s S]
  IDS.txt: token ids of real text as `tandem tokenize -m TARGET -f TEXT --ids --no-bos` prints them.
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


# The CI prompts of tests/test_dflash.cpp and tests/test_spec_util.h (never trained on; reported separately).
CI_PROMPTS = [[0, 417, 1210, 4145], [0, 306, 258, 1210, 1327], [0, 893], [0, 14, 394, 1210, 4145, 306, 258]]


def cached_step(m, ids, cache, pos0):
    """The target's logits of the last row of ids [B, T] at positions pos0 .., extending cache (per layer (k, v)
    [B, kv_heads, S, hd]; an empty list starts one: T > 1 only then)."""
    b, t = ids.shape
    pos = torch.arange(pos0, pos0 + t, device=ids.device, dtype=torch.float32)
    freqs = torch.outer(pos, m.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x = m.model.embed_tokens(ids)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    first = len(cache) == 0
    for i, layer in enumerate(m.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_norm(a.q_proj(h).view(b, t, a.heads, a.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(h).view(b, t, a.kv_heads, a.head_dim)).transpose(1, 2)
        v = a.v_proj(h).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)
        q = q * cos + dt.rotate_half(q) * sin
        k = k * cos + dt.rotate_half(k) * sin
        if first:
            cache.append((k, v))
        else:
            k = torch.cat([cache[i][0], k], 2)
            v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
        rep = a.heads // a.kv_heads
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                           is_causal=first and t > 1)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, a.heads * a.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return m.lm_head(m.model.norm(x[:, -1]))


@torch.no_grad()
def continue_greedy(m, prompts, length, n_sampled, gen):
    """prompts [B, P] (same P), then n_sampled tokens drawn at temperature 1, then greedy tokens up to length.
    f32 maths (what tandem's CPU and GPU paths compute), the mask token never chosen."""
    ids = prompts
    cache = []
    logits = cached_step(m, ids, cache, 0)
    while ids.shape[1] < length:
        logits = logits.float()
        logits[:, MASK_ID] = -float("inf")
        if n_sampled > 0:
            u = torch.rand(logits.shape[0], 1, generator=gen).to(logits.device)
            cdf = logits.softmax(-1).cumsum(-1)
            nxt = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=logits.shape[1] - 1).squeeze(1)
            n_sampled -= 1
        else:
            nxt = logits.argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        if ids.shape[1] < length:
            logits = cached_step(m, nxt[:, None], cache, ids.shape[1] - 1)
    return ids


def make_data(m, n_seq, length, device, gen, text, chunk):
    """n_seq sequences of `length` tokens in chunks of one prompt length each: BOS + a window of `text` (when
    given, 2 chunks in 3) or BOS + tokens sampled by the target, 2..48 prompt tokens in all, then the greedy
    continuation. Returns ids [n_seq, length] and each sequence's first anchor (its last prompt token)."""
    out, lo = [], []
    for c0 in range(0, n_seq, chunk):
        b = min(chunk, n_seq - c0)
        p = int(torch.randint(2, 49, (1,), generator=gen))
        prompts = torch.zeros(b, 1, dtype=torch.long)
        n_sampled = p - 1
        if text is not None and p > 1 and int(torch.randint(0, 3, (1,), generator=gen)) < 2:
            start = torch.randint(0, len(text) - p, (b,), generator=gen)
            win = torch.stack([text[s:s + p - 1] for s in start.tolist()])
            prompts = torch.cat([prompts, win], 1)
            n_sampled = 0
        ids = continue_greedy(m, prompts.to(device), length, n_sampled, gen)
        out.append(ids.cpu())
        lo.append(torch.full((b,), p - 1, dtype=torch.long))
    return torch.cat(out), torch.cat(lo)


def block_batch(ids, first, feats, embed, n_anchor, gen, device, anchors=None):
    """The training rows of one batch: anchors a (from each sequence's first anchor, its last prompt token, on;
    or the given anchors [B, K]), block embeddings, positions, mask, labels [B, K, BLOCK-1]."""
    bsz, length = ids.shape
    if anchors is None:
        lo = first.clamp(max=length - BLOCK)
        r = torch.rand(bsz, n_anchor, generator=gen)
        a = (lo[:, None] + (r * (length - BLOCK - lo[:, None] + 1)).long()).clamp(max=length - BLOCK)  # [B, K]
    else:
        a = anchors
        n_anchor = a.shape[1]
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


@torch.no_grad()
def evaluate(d, m, ids, first, device):
    """Teacher-forced acceptance over every anchor from each sequence's first (its last prompt token) on:
    slot j counts when slots 1 .. j are all the true tokens. Returns (mean accepted length, P(slots 1..j right)
    per j, blocks)."""
    length = ids.shape[1]
    runs = []
    for b0 in range(0, ids.shape[0], 32):
        bi, bf = ids[b0:b0 + 32], first[b0:b0 + 32]
        k = int(length - BLOCK - int(bf.min()) + 1)
        a = bf[:, None] + torch.arange(k)[None]
        valid = a <= length - BLOCK
        a = a.clamp(max=length - BLOCK)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            _, feats = target_forward(m, bi.to(device))
            noise, q_pos, ctx_pos, mask, labels = block_batch(bi, bf, feats, m.model.embed_tokens, 0, None, device,
                                                              anchors=a)
            logits = m.lm_head(d(noise, feats, q_pos, ctx_pos, mask))
        pred = logits.float().argmax(-1).view(len(bi), k, BLOCK)[:, :, 1:]
        run = torch.cumprod((pred == labels).long(), -1)
        runs.append(run[valid.to(device)].cpu())
    run = torch.cat(runs).double()
    return float(run.sum(-1).mean() + 1.0), [float(x) for x in run.mean(0)], int(run.shape[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/tandem-small-q8_0.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--text-ids", help="token ids of real text (`tandem tokenize --ids --no-bos` output)")
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
    text_train = text_eval = None
    if args.text_ids:
        with open(args.text_ids) as f:
            text = torch.tensor([int(x) for x in f.read().strip().strip("[]").split(",") if x.strip()])
        cut = int(len(text) * 0.85)  # the drafter never sees prompts from the last 15%
        text_train, text_eval = text[:cut], text[cut:]
    n_seq, n_eval, length = (16, 8, 56) if args.smoke else (16384, 512, 112)
    chunk = 8 if args.smoke else 1024
    data, first = make_data(m, n_seq, length, device, gen, text_train, chunk)
    eval_ids, eval_first = make_data(m, n_eval, length, device, gen, text_eval, 4 if args.smoke else 32)
    ci = [continue_greedy(m, torch.tensor([p]).to(device), length, 0, gen).cpu() for p in CI_PROMPTS]
    ci_ids, ci_first = torch.cat(ci), torch.tensor([len(p) - 1 for p in CI_PROMPTS])
    print("data: %d + %d sequences of %d tokens in %.1f s" % (n_seq, n_eval, length, time.time() - t_start),
          flush=True)

    d = dt.DFlashDraft(c).to(device)
    for p in d.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(d.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01)
    bsz, n_anchor = (4, 4) if args.smoke else (64, 16)
    w = torch.exp(-torch.arange(BLOCK - 1, dtype=torch.float32, device=device) / 4.0)
    w = w / w.sum()
    budget = args.deadline_s - (time.time() - t_start) - (25 if not args.smoke else 0)
    max_steps = 3 if args.smoke else 1000000
    t0 = time.time()
    step, losses = 0, []
    est_steps, t10 = None, None
    while step < max_steps:
        el = time.time() - t0
        if el > budget:
            break
        # The run's length in steps, from the pace of steps 10..50 (the first steps carry start-up costs).
        if step == 10:
            t10 = el
        if step == 50 and est_steps is None:
            est_steps = 50 + int((budget - el) / max((el - t10) / 40, 1e-6))
        sel = torch.randint(0, data.shape[0], (bsz,), generator=gen)
        ids, fst = data[sel], first[sel]
        with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            _, feats = target_forward(m, ids.to(device))
        noise, q_pos, ctx_pos, mask, labels = block_batch(ids, fst, feats, m.model.embed_tokens, n_anchor, gen, device)
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
        losses.append(float(loss.detach()))
        if step % 200 == 0:
            print("step %d loss %.4f lr %.2e (%.0f s)" % (step, losses[-1], lr, time.time() - t0), flush=True)
        step += 1

    d.eval()
    acc_len, per_slot, n_blocks = evaluate(d, m, eval_ids, eval_first, device)
    ci_len, ci_slot, ci_blocks = evaluate(d, m, ci_ids, ci_first, device)
    tr_len, _, _ = evaluate(d, m, data[:64], first[:64], device)
    res = {"steps": step, "final_loss": float(np.mean(losses[-50:])) if losses else None,
           "eval_blocks": n_blocks, "teacher_forced_mean_accepted_length": acc_len,
           "per_slot_acceptance": per_slot,
           "ci_prompts_teacher_forced_mean_accepted_length": ci_len, "ci_prompts_per_slot": ci_slot,
           "ci_blocks": ci_blocks, "train_sequences_teacher_forced_mean_accepted_length": tr_len,
           "seconds": time.time() - t_start, "train_sequences": n_seq, "length": length,
           "config": c, "taps": TAPS, "block_size": BLOCK, "mask_token_id": MASK_ID, "device": device,
           "text_ids": args.text_ids}
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
