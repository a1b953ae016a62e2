#!/usr/bin/env python3
"""DFlash drafter parity (issue 18): tandem's dflash forward against the PyTorch reimplementation of z-lab's
DFlashDraftModel (models/training/dflash_torch.py, written from the published description /
GGUF-ARCH-FACTS E.3), on random weights, given the same fused target features.

The script writes a random drafter (F32) and a random qwen3 target (F32; the drafter borrows its token_embd and
output), random features for P context positions and a block [last, mask x n]; tandem_gpu_tests
(DflashGpu.DumpDrafterLogitsForReference) injects the features, runs the block on cuda:0 and on the CPU and
writes the logits; the script compares them with PyTorch's (fp32, TF32 off): max |a - b| / max |b| per row must
stay below 1e-3.

usage: python3 tests/reference/dflash_parity.py --tests build-gpu/tests/tandem_gpu_tests --work DIR
prints PASS/FAIL lines; exit status 0 when every row passes.
"""

import argparse
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "training"))
import dflash_torch as dt  # noqa: E402


def random_target(E, V, L, heads, kv, hd, ffn, rng):
    """A random qwen3 target GGUF (only its token_embd and output matter here)."""
    a = "qwen3."
    meta = [("general.architecture", 8, "qwen3"), ("general.name", 8, "parity-target"),
            (a + "block_count", 4, L), (a + "context_length", 4, 4096), (a + "embedding_length", 4, E),
            (a + "feed_forward_length", 4, ffn), (a + "attention.head_count", 4, heads),
            (a + "attention.head_count_kv", 4, kv), (a + "attention.key_length", 4, hd),
            (a + "attention.value_length", 4, hd), (a + "rope.freq_base", 6, 10000.0),
            (a + "attention.layer_norm_rms_epsilon", 6, 1e-6)]

    def m(o, i, s=1.0):
        return (rng.standard_normal((o, i)) * s / np.sqrt(i)).astype(np.float32)

    t = [("token_embd.weight", m(V, E, np.sqrt(E))), ("output.weight", m(V, E, 3.0)),
         ("output_norm.weight", np.ones(E, np.float32))]
    for i in range(L):
        b = "blk.%d." % i
        t += [(b + "attn_norm.weight", np.ones(E, np.float32)), (b + "attn_q.weight", m(heads * hd, E)),
              (b + "attn_k.weight", m(kv * hd, E)), (b + "attn_v.weight", m(kv * hd, E)),
              (b + "attn_output.weight", m(E, heads * hd)), (b + "attn_q_norm.weight", np.ones(hd, np.float32)),
              (b + "attn_k_norm.weight", np.ones(hd, np.float32)), (b + "ffn_norm.weight", np.ones(E, np.float32)),
              (b + "ffn_gate.weight", m(ffn, E)), (b + "ffn_up.weight", m(ffn, E)), (b + "ffn_down.weight", m(E, ffn))]
    return meta, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", default="build-gpu/tests/tandem_gpu_tests")
    ap.add_argument("--work", default="/tmp/dflash_parity")
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    rng = np.random.default_rng(18)
    torch.manual_seed(18)
    # A Qwen3-style drafter of moderate width: 2 layers, 3 taps, GQA 16/8 of 64, SwiGLU 2816, fc.scale set.
    E, V, P, n, last, mask = 1024, 4096, 37, 15, 123, 4095
    c = {"hidden_size": E, "layers": 2, "heads": 16, "kv_heads": 8, "head_dim": 64, "ffn": 2816,
         "rms_eps": 1e-6, "rope_theta": 1000000.0, "n_taps": 3}
    d = dt.DFlashDraft(c)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[1]) * 1.5)
            else:
                p.copy_(1.0 + 0.3 * (2 * torch.rand_like(p) - 1))
    d.fc_scale = 0.5
    tmeta, tt = random_target(E, V, 2, 16, 8, 64, 2816, rng)
    dt.write_gguf(os.path.join(args.work, "target.gguf"), tmeta, tt, q8=False)
    dmeta = dt.drafter_gguf_meta(c, [2, 5, 9], 16, mask, 4096, "parity-drafter")
    dt.write_gguf(os.path.join(args.work, "drafter.gguf"), dmeta, dt.drafter_gguf_tensors(d), q8=False)
    feats = (rng.standard_normal((P, 3 * E)) * 2.0).astype(np.float32)
    feats.tofile(os.path.join(args.work, "features.f32"))
    with open(os.path.join(args.work, "case.txt"), "w") as f:
        f.write("%d %d %d %d %d\n" % (P, 3 * E, last, n, mask))

    # The reference, fp64 on the CPU (the drafter is small): logits of block rows 1 .. n.
    emb = dict(tt)["token_embd.weight"]
    head = dict(tt)["output.weight"]
    d64 = d.double()
    d64.fc_scale = 0.5
    with torch.no_grad():
        noise = torch.from_numpy(emb[[last] + [mask] * n].astype(np.float64))[None]
        q_pos = torch.arange(P, P + n + 1)[None]
        ctx_pos = torch.arange(P)[None]
        vis = torch.ones(1, 1, n + 1, P + n + 1, dtype=torch.bool)
        h = d64(noise, torch.from_numpy(feats.astype(np.float64))[None], q_pos, ctx_pos, vis)
        ref = (h[0, 1:] @ torch.from_numpy(head.astype(np.float64)).T).numpy()

    env = dict(os.environ, TANDEM_DFLASH_PARITY_DIR=args.work)
    r = subprocess.run([args.tests, "--gtest_filter=DflashGpu.DumpDrafterLogitsForReference"], env=env,
                       capture_output=True, text=True)
    print(r.stdout[-2000:])
    if r.returncode != 0:
        print("FAIL dflash parity: tandem_gpu_tests failed\n" + r.stderr[-2000:])
        return 1
    ok = True
    for dev in ("cuda", "cpu"):
        path = os.path.join(args.work, "logits_%s.f32" % dev)
        if not os.path.exists(path):
            print("FAIL dflash parity %s: no logits written" % dev)
            ok = False
            continue
        got = np.fromfile(path, dtype=np.float32).reshape(n, V)
        errs = [float(np.abs(got[i] - ref[i]).max() / np.abs(ref[i]).max()) for i in range(n)]
        worst = max(errs)
        same_top = int((got.argmax(-1) == ref.argmax(-1)).sum())
        status = "PASS" if worst < args.tol else "FAIL"
        ok &= worst < args.tol
        print("%s dflash parity %s: max rel error %.2e over %d block rows (tol %.0e); argmax equal in %d/%d"
              % (status, dev, worst, n, args.tol, same_top, n))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
