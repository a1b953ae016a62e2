#!/usr/bin/env python3
"""tandem's forward pass against Hugging Face transformers, on randomly initialised models.

For each model of SPECS: make a random Qwen3ForCausalLM / LlamaForCausalLM (float32, weights re-drawn so logits
are well spread), save it with a byte-level BPE tokenizer.json, convert it with `tandem convert --type f32` and
`--type bf16`, run `tandem generate` on the CPU (greedy, f32 KV cache, --dump-logits), and compare with
transformers in float32 (TF32 off, eager attention):

- f32:  logits of a 64-token prompt and of the 16 greedy steps that follow (transformers run teacher-forced on
        the same tokens), max relative error <= 1e-4; the 17 greedy tokens identical to transformers' own greedy
        continuation.
- bf16: the same logits against the float32 model, max relative error <= 2e-2; greedy tokens identical to
        transformers' greedy continuation with the same bf16-rounded weights (computed in float32), which is the
        function the bf16 file holds (against the unrounded model, greedy agreement is reported, not required).
- batch: 4 prompts of different lengths decoded together (one batch per step) give the logits of each prompt
        alone (tandem single runs: relative error reported; transformers: <= 1e-4) and the same greedy tokens.

Relative error of a row: max_i |tandem_i - hf_i| / max_i |hf_i|; a model's figure is the maximum over rows.

Writes into OUT: summary.txt (the table), results.json (every figure), and for the specs marked `fixture` the
f32 GGUF and a JSON with transformers' logits for a fixed prompt plus its greedy continuation: the CI fixture of
tests/test_model_hf_fixture.cpp (copy them to tests/data/models/).

Every model runs inside its own try block: a failure is reported in the summary and the next model runs.

--fake-hf: no torch needed. Writes random checkpoints in pure Python (config.json, safetensors, tokenizer.json)
and runs only the conversion and tandem stages; for checking this script where transformers is not installed.
"""

import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path

F32_TOL = 1e-4
BF16_TOL = 2e-2
PROMPT_LEN = 64
N_GREEDY = 17  # the first token comes from the prompt's last row, then 16 decode steps
BATCH_PROMPT_LENS = [64, 37, 50, 21]
FIXTURE_PROMPT_LEN = 12
FIXTURE_GREEDY = 8

SPECS = [
    dict(name="qwen3_tiny", arch="qwen3", vocab=384, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
         ff=128, tie=True, theta=1e6, fixture=True, batch=True),
    dict(name="llama_tiny", arch="llama", vocab=320, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
         ff=128, tie=False, theta=10000.0, fixture=True, batch=True),
    dict(name="qwen3_small", arch="qwen3", vocab=512, hidden=256, layers=4, heads=8, kv_heads=2, head_dim=64,
         ff=512, tie=False, theta=1e6, batch=True),
    dict(name="llama3_scaled", arch="llama", vocab=512, hidden=128, layers=3, heads=8, kv_heads=2, head_dim=16,
         ff=256, tie=True, theta=10000.0, batch=True,
         llama3=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)),
    dict(name="qwen3_0.6b_shape", arch="qwen3", vocab=151936, hidden=1024, layers=28, heads=16, kv_heads=8,
         head_dim=128, ff=3072, tie=True, theta=1e6, batch=False),
]

# ---- tokenizer.json (a byte-level BPE of the 256 bytes, no merges, one special token) --------------------------


def byte_token(b):
    printable = (33 <= b <= 126) or (0xA1 <= b <= 0xAC) or (0xAE <= b <= 0xFF)
    if printable:
        return chr(b)
    n = sum(1 for x in range(b) if not ((33 <= x <= 126) or (0xA1 <= x <= 0xAC) or (0xAE <= x <= 0xFF)))
    return chr(256 + n)


def write_tokenizer(d):
    vocab = {byte_token(b): b for b in range(256)}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": None, "pad_token": "<|endoftext|>", "add_bos_token": False}))


# ---- tandem ------------------------------------------------------------------------------------------------------


def run(cmd, log, timeout=900):
    t0 = time.time()
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    log(f"  $ {' '.join(str(c) for c in cmd)}  [{time.time() - t0:.1f}s, rc {p.returncode}]")
    if p.returncode != 0:
        raise RuntimeError(f"command failed (rc {p.returncode}): {' '.join(str(c) for c in cmd)}\n"
                           f"stderr: {p.stderr.strip()[-2000:]}")
    return p


def read_dump(path):
    """--dump-logits file -> {seq: {pos: list-or-tensor of n_vocab floats}}."""
    data = Path(path).read_bytes()
    assert data[:4] == b"TLOG", f"{path}: not a logits dump"
    n_vocab = struct.unpack_from("<I", data, 4)[0]
    rec = 8 + 4 * n_vocab
    assert (len(data) - 8) % rec == 0, f"{path}: truncated"
    out = {}
    try:
        import torch
        body = torch.frombuffer(bytearray(data[8:]), dtype=torch.float32).view(-1, 2 + n_vocab)
        ints = body[:, :2].contiguous().view(torch.int32)
        for r in range(body.shape[0]):
            out.setdefault(int(ints[r, 0]), {})[int(ints[r, 1])] = body[r, 2:].clone()
    except ImportError:
        for off in range(8, len(data), rec):
            seq, pos = struct.unpack_from("<ii", data, off)
            out.setdefault(seq, {})[pos] = list(struct.unpack_from(f"<{n_vocab}f", data, off + 8))
    return n_vocab, out


def tandem_generate(tandem, gguf, prompts, work, tag, log, threads):
    dump = work / f"{tag}.logits"
    ids_arg = ";".join(",".join(str(t) for t in p) for p in prompts)
    p = run([tandem, "generate", "-m", gguf, "--prompt-ids", ids_arg, "-n", N_GREEDY, "--temp", "0", "--ignore-eos",
             "--ids", "--kv-type", "f32", "--ctx", 2048, "-t", threads, "--dump-logits", dump], log)
    ids = [[int(x) for x in line.split()] for line in p.stdout.strip().splitlines()]
    assert len(ids) == len(prompts), p.stdout
    _, rows = read_dump(dump)
    dump.unlink()
    speed = [l for l in p.stderr.splitlines() if "tokens/s" in l]
    return ids, rows, speed


def stack_rows(rows_of_seq, n):
    import torch
    return torch.stack([rows_of_seq[pos] for pos in range(n)])


def rel_error(a, b):
    """max over rows of max|a-b| / max|b| (a, b: [rows, vocab] float tensors)."""
    num = (a.double() - b.double()).abs().amax(dim=1)
    den = b.double().abs().amax(dim=1).clamp_min(1e-30)
    return float((num / den).max())


# ---- transformers -------------------------------------------------------------------------------------------------


def make_hf_model(spec, d, device, log):
    import inspect
    import torch
    import transformers

    arch = spec["arch"]
    cfg_cls = transformers.Qwen3Config if arch == "qwen3" else transformers.LlamaConfig
    model_cls = transformers.Qwen3ForCausalLM if arch == "qwen3" else transformers.LlamaForCausalLM
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["ff"],
              num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
              num_key_value_heads=spec["kv_heads"], head_dim=spec["head_dim"], max_position_embeddings=4096,
              rms_norm_eps=1e-6, tie_word_embeddings=spec["tie"], bos_token_id=None, eos_token_id=256,
              pad_token_id=None, attention_bias=False)
    if arch == "llama":
        kw["mlp_bias"] = False
    rope = {"rope_type": "llama3", **spec["llama3"]} if spec.get("llama3") else {"rope_type": "default"}
    params = inspect.signature(cfg_cls.__init__).parameters
    if "rope_parameters" in params:  # transformers >= 5
        kw["rope_parameters"] = {**rope, "rope_theta": spec["theta"]}
    else:
        kw["rope_theta"] = spec["theta"]
        if spec.get("llama3"):
            kw["rope_scaling"] = rope
    cfg = cfg_cls(**kw)
    try:
        cfg._attn_implementation = "eager"  # plain softmax(QK^T)V in float32
    except Exception as e:
        log(f"  could not select eager attention: {e}")
    torch.manual_seed(1234)
    with torch.device(device):
        model = model_cls(cfg)
    model = model.float().eval()
    # Redraw every weight so activations and logits are well spread (the default init gives near-uniform
    # logits, where a rounding difference could flip a greedy token).
    g = torch.Generator(device=device).manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g, device=device) * 0.8 + 0.6)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g, device=device))
            else:
                scale = (2.0 if "lm_head" in name else 1.0) / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=g, device=device) * scale)
    # What rope HF actually uses (inv_freq), against the unscaled formula, so a config HF ignored shows up here
    # (llama3 scaling: the max ratio is the scaling factor; none: 1).
    try:
        inv = model.model.rotary_emb.inv_freq.double().cpu()
        base = 1.0 / (spec["theta"] ** (torch.arange(0, spec["head_dim"], 2, dtype=torch.float64) / spec["head_dim"]))
        rope_note = f"HF inv_freq: max ratio to the unscaled frequencies {float((base / inv).max()):.4g}"
    except Exception as e:  # only a diagnostic
        rope_note = f"HF inv_freq not readable: {e}"
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)  # safetensors by default
    write_tokenizer(d)
    log(f"  HF {model_cls.__name__}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params; {rope_note}")
    return model, rope_note


def hf_logits(model, ids, device):
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    return out.logits[0].float().cpu()


def hf_greedy(model, prompt, n, device):
    import torch
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            ids.append(t)
    return out


def round_to_bf16_(model):
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))


# ---- a fake checkpoint in pure Python (--fake-hf) ----------------------------------------------------------------


def write_fake_checkpoint(spec, d):
    rnd = random.Random(7)
    d.mkdir(parents=True, exist_ok=True)
    E, V, hd = spec["hidden"], spec["vocab"], spec["head_dim"]
    tensors = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if not spec["tie"]:
        tensors["lm_head.weight"] = (V, E)
    for l in range(spec["layers"]):
        p = f"model.layers.{l}."
        tensors.update({p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,),
                        p + "self_attn.q_proj.weight": (spec["heads"] * hd, E),
                        p + "self_attn.k_proj.weight": (spec["kv_heads"] * hd, E),
                        p + "self_attn.v_proj.weight": (spec["kv_heads"] * hd, E),
                        p + "self_attn.o_proj.weight": (E, spec["heads"] * hd),
                        p + "mlp.gate_proj.weight": (spec["ff"], E), p + "mlp.up_proj.weight": (spec["ff"], E),
                        p + "mlp.down_proj.weight": (E, spec["ff"])})
        if spec["arch"] == "qwen3":
            tensors.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    header, blobs, off = {}, [], 0
    for name, shape in tensors.items():
        n = math.prod(shape)
        vals = [rnd.uniform(0.6, 1.4) for _ in range(n)] if len(shape) == 1 else \
            [rnd.gauss(0, 1 / math.sqrt(shape[1])) for _ in range(n)]
        blob = struct.pack(f"<{n}f", *vals)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hjson = json.dumps(header).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    cfg = {"architectures": ["Qwen3ForCausalLM" if spec["arch"] == "qwen3" else "LlamaForCausalLM"],
           "model_type": spec["arch"], "vocab_size": V, "hidden_size": E, "intermediate_size": spec["ff"],
           "num_hidden_layers": spec["layers"], "num_attention_heads": spec["heads"],
           "num_key_value_heads": spec["kv_heads"], "head_dim": hd, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-6, "rope_theta": spec["theta"], "tie_word_embeddings": spec["tie"],
           "torch_dtype": "float32", "eos_token_id": 256}
    if spec.get("llama3"):
        cfg["rope_scaling"] = {"rope_type": "llama3", **spec["llama3"]}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(d)


# ---- one model ------------------------------------------------------------------------------------------------------


def check_model(spec, args, log, out_dir):
    work = Path(args.work) / spec["name"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hf_dir = work / "hf"
    res = {"name": spec["name"], "spec": {k: v for k, v in spec.items() if k != "name"}}
    t0 = time.time()
    rng = random.Random(zlib.crc32(spec["name"].encode()))
    n_text = 256  # prompts use the byte tokens (any id < vocab would do)
    prompt = [rng.randrange(n_text) for _ in range(PROMPT_LEN)]

    model = None
    device = args.device
    if args.fake_hf:
        write_fake_checkpoint(spec, hf_dir)
    else:
        model, res["rope_note"] = make_hf_model(spec, hf_dir, device, log)
    res["t_make_s"] = round(time.time() - t0, 1)

    ggufs = {}
    for t in ("f32", "bf16"):
        ggufs[t] = work / f"{spec['name']}-{t}.gguf"
        run([args.tandem, "convert", hf_dir, "-o", ggufs[t], "--type", t, "-q", "--threads", args.threads], log)
    for f in hf_dir.glob("*.safetensors"):
        f.unlink()  # free the disk: the GGUFs hold the weights now

    ids32, rows32, speed = tandem_generate(args.tandem, ggufs["f32"], [prompt], work, "f32", log, args.threads)
    res["tandem_speed_f32"] = speed
    ids16, rows16, _ = tandem_generate(args.tandem, ggufs["bf16"], [prompt], work, "bf16", log, args.threads)
    n_rows = PROMPT_LEN + N_GREEDY - 1
    for name, rows in (("f32", rows32), ("bf16", rows16)):
        assert sorted(rows[0].keys()) == list(range(n_rows)), f"{name}: dump rows {sorted(rows[0].keys())[:5]}..."

    batch = None
    if spec.get("batch"):
        prompts = [prompt[:BATCH_PROMPT_LENS[0]]] + [[rng.randrange(n_text) for _ in range(n)]
                                                     for n in BATCH_PROMPT_LENS[1:]]
        b_ids, b_rows, _ = tandem_generate(args.tandem, ggufs["f32"], prompts, work, "batch", log, args.threads)
        singles = [(ids32[0], rows32[0])]  # prompt 0 is the single-run prompt above
        for i, p in enumerate(prompts[1:], 1):
            s_ids, s_rows, _ = tandem_generate(args.tandem, ggufs["f32"], [p], work, f"single{i}", log, args.threads)
            singles.append((s_ids[0], s_rows[0]))
        batch = (prompts, b_ids, b_rows, singles)

    if args.fake_hf:
        res["status"] = "fake checkpoint: conversion and tandem ran (no transformers comparison)"
        res["ok"] = True
        log(f"  tandem greedy f32: {ids32[0]}")
        return res

    import torch
    tf32_seq = prompt + ids32[0][:-1]
    tbf_seq = prompt + ids16[0][:-1]
    hf32 = hf_logits(model, tf32_seq, device)
    hf_for_bf16 = hf_logits(model, tbf_seq, device)
    hf_greedy_ids = hf_greedy(model, prompt, N_GREEDY, device)
    t32 = stack_rows(rows32[0], n_rows)
    t16 = stack_rows(rows16[0], n_rows)
    res["f32_rel_prompt"] = rel_error(t32[:PROMPT_LEN], hf32[:PROMPT_LEN])
    res["f32_rel_steps"] = rel_error(t32[PROMPT_LEN:], hf32[PROMPT_LEN:])
    res["f32_greedy_equal"] = ids32[0] == hf_greedy_ids
    res["bf16_rel_vs_f32_model"] = rel_error(t16, hf_for_bf16)
    res["bf16_greedy_equal_f32_model"] = ids16[0] == hf_greedy_ids
    res["hf_greedy"] = hf_greedy_ids
    res["tandem_greedy_f32"] = ids32[0]
    res["tandem_greedy_bf16"] = ids16[0]

    if batch:
        prompts, b_ids, b_rows, singles = batch
        worst_vs_single, worst_vs_hf, ids_equal = 0.0, 0.0, True
        for i, p in enumerate(prompts):
            n = len(p) + N_GREEDY - 1
            br = stack_rows(b_rows[i], n)
            sr = stack_rows(singles[i][1], n)
            worst_vs_single = max(worst_vs_single, rel_error(br, sr))
            hl = hf_logits(model, p + b_ids[i][:-1], device)
            worst_vs_hf = max(worst_vs_hf, rel_error(br, hl))
            ids_equal = ids_equal and b_ids[i] == singles[i][0]
        res["batch_rel_vs_single"] = worst_vs_single
        res["batch_rel_vs_hf"] = worst_vs_hf
        res["batch_greedy_equal_single"] = ids_equal

    fixture = None
    if spec.get("fixture"):
        fprompt = prompt[:FIXTURE_PROMPT_LEN]
        fgreedy = hf_greedy(model, fprompt, FIXTURE_GREEDY, device)
        ftokens = fprompt + fgreedy[:-1]
        flogits = hf_logits(model, ftokens, device)
        fixture = {"model": f"{spec['name']}.gguf", "prompt": fprompt, "greedy": fgreedy, "tokens": ftokens,
                   "logits": [[float(f"{x:.9g}") for x in row.tolist()] for row in flogits],
                   "relative_tolerance": F32_TOL, "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__,
                   "note": "transformers float32 logits of every row of `tokens` (the prompt followed by the first "
                           "greedy tokens); `greedy` is transformers' greedy continuation of `prompt`"}

    round_to_bf16_(model)  # from here on: the function the bf16 file holds, in float32
    hf_r = hf_logits(model, tbf_seq, device)
    res["bf16_rel_vs_rounded_model"] = rel_error(t16, hf_r)
    res["bf16_greedy_equal_rounded_model"] = ids16[0] == hf_greedy(model, prompt, N_GREEDY, device)

    ok = (res["f32_rel_prompt"] <= F32_TOL and res["f32_rel_steps"] <= F32_TOL and res["f32_greedy_equal"]
          and res["bf16_rel_vs_f32_model"] <= BF16_TOL and res["bf16_greedy_equal_rounded_model"])
    if batch:
        ok = ok and res["batch_rel_vs_hf"] <= F32_TOL and res["batch_greedy_equal_single"]
    res["ok"] = ok
    if fixture:
        shutil.copy(ggufs["f32"], out_dir / f"{spec['name']}.gguf")
        (out_dir / f"{spec['name']}.json").write_text(json.dumps(fixture))
    res["t_total_s"] = round(time.time() - t0, 1)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res


def fmt(x):
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return f"{x:.2e}"
    return "-" if x is None else str(x)


def summary_text(results, header):
    cols = [("model", "name"), ("f32 prompt", "f32_rel_prompt"), ("f32 steps", "f32_rel_steps"),
            ("f32 greedy", "f32_greedy_equal"), ("bf16 vs f32", "bf16_rel_vs_f32_model"),
            ("bf16 vs rounded", "bf16_rel_vs_rounded_model"), ("bf16 greedy (rounded)", "bf16_greedy_equal_rounded_model"),
            ("bf16 greedy (f32)", "bf16_greedy_equal_f32_model"), ("batch vs single", "batch_rel_vs_single"),
            ("batch vs hf", "batch_rel_vs_hf"), ("batch greedy", "batch_greedy_equal_single"), ("pass", "ok")]
    lines = header + ["", "| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join(fmt(r.get(k)) for _, k in cols) + " |")
    lines.append("")
    for r in results:
        if "error" in r:
            lines += [f"{r['name']}: FAILED", r["error"], ""]
        for k in ("rope_note", "tandem_speed_f32", "t_make_s", "t_total_s"):
            if k in r:
                lines.append(f"{r['name']} {k}: {r[k]}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", required=True, help="the tandem binary")
    ap.add_argument("--out", required=True, help="summary, results and fixture files go here")
    ap.add_argument("--work", default="/tmp/tandem_model_parity", help="scratch directory (checkpoints, GGUFs)")
    ap.add_argument("--only", default="", help="comma-separated spec names (default: all)")
    ap.add_argument("--device", default="", help="transformers device (default: cuda when available)")
    ap.add_argument("--threads", default=str(os.cpu_count() or 4), help="tandem CPU threads")
    ap.add_argument("--fake-hf", action="store_true", help="pure-Python checkpoints, no transformers stage")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = [f"tandem model parity vs transformers ({time.strftime('%Y-%m-%d %H:%M:%S')})",
              f"relative error = max over rows of max|tandem - hf| / max|hf|; f32 tol {F32_TOL}, bf16 tol {BF16_TOL}",
              f"prompt {PROMPT_LEN} tokens + {N_GREEDY} greedy tokens (16 decode steps); batch prompts "
              f"{BATCH_PROMPT_LENS}"]
    if not args.fake_hf:
        import torch
        import transformers
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        if not args.device:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        header.append(f"torch {torch.__version__}, transformers {transformers.__version__}, hf device "
                      f"{args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    v = subprocess.run([args.tandem, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
    commit = os.environ.get("PARITY_COMMIT", "")
    header.append(f"{v}{' at commit ' + commit if commit else ''}, tandem on the CPU with {args.threads} threads, "
                  f"f32 KV cache")

    def log(msg):
        print(msg, flush=True)

    only = set(filter(None, args.only.split(",")))
    results = []
    for spec in SPECS:
        if only and spec["name"] not in only:
            continue
        log(f"== {spec['name']}")
        try:
            r = check_model(spec, args, log, out_dir)
        except Exception as e:  # report and go on with the next model
            r = {"name": spec["name"], "ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            log(r["error"])
        results.append(r)
        log("  " + json.dumps({k: v for k, v in r.items() if k not in ("spec", "error")}))
        (out_dir / "results.json").write_text(json.dumps(results, indent=1))
        (out_dir / "summary.txt").write_text(summary_text(results, header))
        shutil.rmtree(Path(args.work) / spec["name"], ignore_errors=True)
    print(summary_text(results, header))
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
