#!/usr/bin/env python3
"""`tandem convert` against llama.cpp's convert_hf_to_gguf.py on the same z-lab DFlash drafter (issue 18, item 1:
"keys and tensors exactly as llama.cpp writes them"), on the CPU.

A random f32 DFlashDraftModel checkpoint (z-lab's layout: modules at the top level, layers.N..., fc, hidden_norm,
norm; no embeddings and no head; config block_size and dflash_config {target_layer_ids, mask_token_id}) and a
random Qwen3 target (config.json, model.safetensors, a byte-level BPE tokenizer.json for tandem and a
sentencepiece tokenizer.model for llama.cpp's converter, which reads the target's vocabulary through the target
model class's own vocab code: for Qwen3, sentencepiece first). Both converters run with --outtype f32 and
--target-model-dir. Compared: every dflash.* key, tokenizer.ggml.mask_token_id (a tokenizer key that carries the
drafter's mask token), and every tensor (name, shape, type, bytes); other tokenizer.* keys are INFO (the two
converters read different tokenizer files of the target here). Variants: two taps (HF layers 0, 2) and a single
tap with a sliding-window drafter (use_sliding_window, layer_types).
Then tandem loads each drafter file as the DFlash drafter of the converted target and decodes (greedy, same
prompt, --draft-p-min 0.15): the two runs must print the same tokens and statistics. Random weights accept
nothing, but with a p_min a block stops at its first draft token less likely than 0.15, so the number of tokens
drafted follows the drafter's probabilities at every draft position: a fingerprint of what it computes.

llama.cpp's converter runs under --python; where that has no transformers, the stand-in of convert_diff_util.py.
Usage: dflash_convert_diff.py --tandem BIN/tandem --llama-src DIR [--python /usr/bin/python3] [--out DIR]
Exit 0 only when every variant converted with both, compared equal and ran the same."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import byte_level_tokenizer as blt  # noqa: E402
import convert_diff_util as cdu  # noqa: E402

E, N_LAYER_TARGET, N_HEAD, N_KV, HD, N_FF = 64, 4, 4, 2, 32, 96
VARIANTS = {
    "two_taps": dict(taps=[0, 2], layers=1, sliding=False),
    "one_tap_swa": dict(taps=[1], layers=2, sliding=True),
}
CORPUS = ["hello world", "the quick brown fox jumps over the lazy dog", "user model turn", "hello\n\nworld"] * 50


def write_target_tokenizers(d, n_vocab):
    """tokenizer.json (byte-level BPE, Qwen2-style, for tandem) and tokenizer.model (sentencepiece BPE with byte
    fallback, trained here, for llama.cpp's Qwen3 vocab code); both fit in n_vocab."""
    b2u = blt.bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("t", "h"), ("th", "e")]:
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
    added = [blt.added_token(len(vocab) + i, t) for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    tok = blt.byte_level_tokenizer_json(vocab, merges, added)
    assert len(vocab) + len(added) <= n_vocab
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                                         "bos_token": None}))
    try:  # without sentencepiece, llama.cpp's converter reads tokenizer.json through transformers instead
        import sentencepiece as spm
    except ImportError:
        return
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_prefix=str(d / "tokenizer"),
                                   vocab_size=n_vocab - 10, model_type="bpe", byte_fallback=True,
                                   hard_vocab_limit=False, minloglevel=2)
    (d / "tokenizer.vocab").unlink(missing_ok=True)


def write_target(d, n_vocab, seed=1):
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": N_LAYER_TARGET,
           "hidden_size": E, "intermediate_size": N_FF, "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV,
           "head_dim": HD, "vocab_size": n_vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu", "dtype": "float32"}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    write_target_tokenizers(d, n_vocab)
    shapes = {"model.embed_tokens.weight": (n_vocab, E), "model.norm.weight": (E,), "lm_head.weight": (n_vocab, E)}
    for il in range(N_LAYER_TARGET):
        shapes.update(layer_shapes(f"model.layers.{il}."))
    rng = np.random.default_rng(seed)
    cdu.write_safetensors(d / "model.safetensors",
                          {n: (0.5 * rng.standard_normal(s)).astype(np.float32) for n, s in sorted(shapes.items())})


def layer_shapes(p):
    return {p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (N_HEAD * HD, E), p + "self_attn.k_proj.weight": (N_KV * HD, E),
            p + "self_attn.v_proj.weight": (N_KV * HD, E), p + "self_attn.o_proj.weight": (E, N_HEAD * HD),
            p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
            p + "mlp.gate_proj.weight": (N_FF, E), p + "mlp.up_proj.weight": (N_FF, E),
            p + "mlp.down_proj.weight": (E, N_FF)}


def write_drafter(d, variant, n_vocab, seed=2):
    v = VARIANTS[variant]
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": v["layers"],
           "hidden_size": E, "intermediate_size": N_FF, "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV,
           "head_dim": HD, "vocab_size": n_vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu", "block_size": 8,
           "dflash_config": {"target_layer_ids": v["taps"], "mask_token_id": n_vocab - 1}, "dtype": "float32"}
    if v["sliding"]:
        cfg.update(use_sliding_window=True, sliding_window=16,
                   layer_types=["sliding_attention"] + ["full_attention"] * (v["layers"] - 1))
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    shapes = {"fc.weight": (E, len(v["taps"]) * E), "hidden_norm.weight": (E,), "norm.weight": (E,)}
    for il in range(v["layers"]):
        shapes.update(layer_shapes(f"layers.{il}."))
    rng = np.random.default_rng(seed)
    cdu.write_safetensors(d / "model.safetensors",
                          {n: (0.5 * rng.standard_normal(s)).astype(np.float32) for n, s in sorted(shapes.items())})


def run_variant(variant, args, work, out_dir, target_dir, target_gguf, n_vocab):
    hf = work / variant
    write_drafter(hf, variant, n_vocab)
    ref, got = out_dir / f"{variant}.llamacpp.gguf", out_dir / f"{variant}.tandem.gguf"
    fail = cdu.convert_both(variant, args.python, args.llama_src, args.tandem, hf, ref, got, work, out_dir,
                            ["--target-model-dir", str(target_dir)])
    if fail:
        return fail
    fail, summary, info = cdu.compare_files(variant, ref, got, "dflash", out_dir / f"{variant}_diff.txt",
                                            mask_id=n_vocab - 1)
    if fail:
        return fail
    # tandem runs both drafter files against the converted target: same tokens, same acceptance statistics.
    runs = []
    for path in (ref, got):
        rc, out, e = cdu.run_tandem(args.tandem, ["generate", "-m", target_gguf, "--spec", "dflash", "--draft", path,
                                                  "--prompt-ids", "5,6,7,8,9,10", "-n", "24", "--temp", "0",
                                                  "--draft-p-min", "0.15"])
        if rc != 0:
            return f"FAIL {variant}: tandem generate with {path.name} exited {rc}: {cdu.last_line(e)}"
        stats = [ln for ln in e.splitlines() if "accept" in ln.lower()]
        runs.append((out, stats))
    if runs[0] != runs[1] or not runs[0][1]:
        return f"FAIL {variant}: {summary}, but tandem drafts differently with llama.cpp's file: {runs}"
    return (f"PASS {variant}: {summary} ({info} tokenizer keys differ, INFO); tandem drafts with llama.cpp's file "
            f"as with its own ({runs[0][1][-1].strip()})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--llama-src", required=True)
    ap.add_argument("--python", default=sys.executable, help="the Python that runs llama.cpp's converter")
    ap.add_argument("--out", default="out/dflash_convert_diff")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.llama_src) / "gguf-py"))  # gguf_diff's GGUFReader
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_vocab = 320
    with tempfile.TemporaryDirectory() as t:
        work = Path(t)
        target_dir, target_gguf = work / "target", out_dir / "target.gguf"
        write_target(target_dir, n_vocab)
        rc, _, e = cdu.run_tandem(args.tandem, ["convert", target_dir, "-o", target_gguf, "--type", "f32"],
                                  out_dir / "target_tandem.txt")
        if rc != 0:
            sys.exit(f"FAIL: tandem convert of the target exited {rc}: {cdu.last_line(e)}")
        status = cdu.run_all("dflash_convert_diff", VARIANTS, lambda v: run_variant(
            v, args, work, out_dir, target_dir, target_gguf, n_vocab))
    sys.exit(status)


if __name__ == "__main__":
    main()
