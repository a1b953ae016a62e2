#!/usr/bin/env python3
"""`tandem convert` against llama.cpp's convert_hf_to_gguf.py on the same Gemma 4 checkpoints (issue 16, item 5:
"convert HF Gemma4ForCausalLM checkpoints to GGUF as llama.cpp's converter does"), on the CPU.

Each variant is a random f32 checkpoint written here with numpy alone (config.json, model.safetensors,
tokenizer.json): the tensor names and shapes of transformers' Gemma4ForCausalLM (the same list
tests/test_convert_gemma4.cpp uses; CI's gemma4 fixtures came from real transformers checkpoints through these
names), and the two config.json forms in use:
  dense_global  global_head_dim / num_global_key_value_heads at the top of text_config, V = K on full layers
                (attention_k_eq_v), the form of the released Gemma 4 checkpoints;
  dense_plc     transformers 5.17's save_pretrained form: the full layers' head_dim / KV heads in
                per_layer_config {"03": {...}}, separate V projections;
  moe           the dense path plus 4 experts (router, fused gate_up, per-expert scale), 26B-A4B style;
  e2b           per-layer token embeddings and projections, KV sharing of the last layers, double-wide MLP.
Both converters write --outtype f32; every key under gemma4.* and every tensor (name, shape, type, bytes) must be
equal. tokenizer.* keys that differ are printed as INFO and not counted (each loader reads its own).

llama.cpp's converter runs under the Python given by --python; where it has no transformers, the stand-in of
convert_diff_util.py (only tokenizer.* keys, not counted, come through it).
On the H200 machine (real transformers) scripts/device/gemma4_convert.sh builds the checkpoints with
transformers itself and uses this file's diff.

With --llama-bin (a llama.cpp build/bin), llama.cpp also runs tandem's file of each variant (our probe
tests/reference/llamacpp_logits_dump.cpp, compiled against it): prompt logits within 1e-3 (max row relative
error) of tandem's, the same 8 greedy ids.

Usage: gemma4_convert_diff.py --tandem BIN/tandem --llama-src DIR [--llama-bin DIR] [--python PY] [--out DIR]
       gemma4_convert_diff.py --diff REF.gguf GOT.gguf          (the diff alone; exit 1 on a mismatch)
Exit 0 only when every variant converted with both and compared equal."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert_diff_util as cdu  # noqa: E402

VARIANTS = {
    "dense_global": dict(moe=False, e2b=False, k_eq_v=True, per_layer_config=False),
    "dense_plc": dict(moe=False, e2b=False, k_eq_v=False, per_layer_config=True),
    "moe": dict(moe=True, e2b=False, k_eq_v=True, per_layer_config=False),
    "e2b": dict(moe=False, e2b=True, k_eq_v=False, per_layer_config=False),
    # config vocab_size above the tokenizer's count (rows for tokens the tokenizer does not have)
    "e2b_trim": dict(moe=False, e2b=True, k_eq_v=False, per_layer_config=False, extra_vocab=11),
}
PROMPT_IDS = "2,300,301,310,6,7,8,290,291"  # <bos>, then tokens of the tokenizer below
N_GREEDY = 8
# llama.cpp's logits against tandem's: two engines' errors add. On the CI fixtures each was measured against
# transformers: tandem <= 1e-4 (CI), llama.cpp 5.4e-4 and 6.3e-4 (its CPU GELU reads an F16 table).
CROSS_TOL = 2e-3
# The tensors whose rows are tokens: trimmed to the tokenizer's count when config.json has more (see TRIMMED).
VOCAB_ROW_TENSORS = ("token_embd.weight", "per_layer_token_embd.weight")
TRIMMED = """llama.cpp's converter trims token_embd to len(model.vocab) + len(added_tokens) rows, which counts twice
the specials a tokenizer.json lists in both (as HF tokenizers' BpeTrainer writes them), and does not trim
per_layer_token_embd; its token list has len(model.vocab) entries. Its own loader then refuses the file
("tensor 'token_embd.weight' has wrong shape"), and so does tandem's. tandem trims both to the token count; that
file loads in llama.cpp (tests/reference/llamacpp_runs_fixtures.py runs such files)."""
# Shape of every variant: 4 layers (sliding, sliding, sliding, full) unless e2b (6 layers, the last 2 sharing KV).
N_EMBD, N_FF, N_HEAD, N_KV, N_KV_G, HD, GHD = 64, 96, 4, 2, 1, 32, 64
N_EXPERT, N_USED, N_FF_EXP, N_PL = 4, 2, 32, 16


# ---------------------------------------------------------------------------------------------- the tokenizer
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "user", "model", "turn"]


def tokenizer_json():
    """A Gemma-style BPE tokenizer.json (byte fallback, "▁" for spaces, no prefix space; decoder Sequence), the
    kind both converters take for Gemma 4: specials, the 256 byte tokens, single characters, then merges that
    build "▁" + each word left to right."""
    vocab, merges = {}, []

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)

    for t in SPECIALS:
        add(t)
    for b in range(256):
        add(f"<0x{b:02X}>")
    add("▁")
    for w in WORDS:
        for ch in w:
            add(ch)
    for w in WORDS:
        cur = "▁"
        for ch in w:
            if cur + ch not in vocab:
                merges.append(f"{cur} {ch}")
                add(cur + ch)
            cur += ch
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, t in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


TOKENIZER_CONFIG = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                    "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True}

# ---------------------------------------------------------------------------------------------- the checkpoint
def text_config_and_shapes(v, n_vocab):
    """The Gemma 4 text_config of a variant dict (VARIANTS) and its HF tensors {name: shape} (names under "model.":
    transformers' Gemma4ForCausalLM; diffusion_gemma_convert_diff.py renames them)."""
    n_layer, shared = (6, 2) if v["e2b"] else (4, 0)
    types = ["full_attention" if il % 4 == 3 or il == n_layer - 1 else "sliding_attention"
             for il in range(n_layer)]
    text = {
        "model_type": "gemma4_text", "num_hidden_layers": n_layer, "hidden_size": N_EMBD,
        "intermediate_size": N_FF, "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV, "head_dim": HD,
        "vocab_size": n_vocab, "sliding_window": 16, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "attention_k_eq_v": v["k_eq_v"], "final_logit_softcapping": 30.0,
        "layer_types": types, "tie_word_embeddings": True, "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": N_PL if v["e2b"] else 0, "vocab_size_per_layer_input": n_vocab,
        "use_double_wide_mlp": v["e2b"], "enable_moe_block": v["moe"],
        "num_experts": N_EXPERT if v["moe"] else None, "top_k_experts": N_USED if v["moe"] else None,
        "moe_intermediate_size": N_FF_EXP if v["moe"] else None,
        "rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                               "partial_rotary_factor": 0.25},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    }
    if v["per_layer_config"]:
        text["per_layer_config"] = {f"{il:02d}": {"head_dim": GHD, "num_key_value_heads": N_KV_G}
                                    for il, t in enumerate(types) if t == "full_attention"}
    else:
        text["global_head_dim"] = GHD
        text["num_global_key_value_heads"] = N_KV_G

    shapes = {"model.embed_tokens.weight": (n_vocab, N_EMBD), "model.norm.weight": (N_EMBD,)}
    if v["e2b"]:
        shapes["model.embed_tokens_per_layer.weight"] = (n_vocab, n_layer * N_PL)
        shapes["model.per_layer_model_projection.weight"] = (n_layer * N_PL, N_EMBD)
        shapes["model.per_layer_projection_norm.weight"] = (N_PL,)
    for il, t in enumerate(types):
        p = f"model.layers.{il}."
        full = t == "full_attention"
        hd, kvh = (GHD, N_KV_G) if full else (HD, N_KV)
        ff = N_FF * 2 if v["e2b"] and il >= n_layer - shared else N_FF
        shapes.update({
            p + "input_layernorm.weight": (N_EMBD,), p + "post_attention_layernorm.weight": (N_EMBD,),
            p + "pre_feedforward_layernorm.weight": (N_EMBD,), p + "post_feedforward_layernorm.weight": (N_EMBD,),
            p + "self_attn.q_proj.weight": (N_HEAD * hd, N_EMBD), p + "self_attn.k_proj.weight": (kvh * hd, N_EMBD),
            p + "self_attn.o_proj.weight": (N_EMBD, N_HEAD * hd), p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,), p + "mlp.gate_proj.weight": (ff, N_EMBD),
            p + "mlp.up_proj.weight": (ff, N_EMBD), p + "mlp.down_proj.weight": (N_EMBD, ff),
            p + "layer_scalar": (1,)})
        if not (full and v["k_eq_v"]):
            shapes[p + "self_attn.v_proj.weight"] = (kvh * hd, N_EMBD)
        if v["moe"]:
            shapes.update({
                p + "router.proj.weight": (N_EXPERT, N_EMBD), p + "router.scale": (N_EMBD,),
                p + "router.per_expert_scale": (N_EXPERT,),
                p + "experts.gate_up_proj": (N_EXPERT, 2 * N_FF_EXP, N_EMBD),
                p + "experts.down_proj": (N_EXPERT, N_EMBD, N_FF_EXP),
                p + "pre_feedforward_layernorm_2.weight": (N_EMBD,),
                p + "post_feedforward_layernorm_1.weight": (N_EMBD,),
                p + "post_feedforward_layernorm_2.weight": (N_EMBD,)})
        if v["e2b"]:
            shapes.update({p + "per_layer_input_gate.weight": (N_PL, N_EMBD),
                           p + "per_layer_projection.weight": (N_EMBD, N_PL),
                           p + "post_per_layer_input_norm.weight": (N_EMBD,)})
    return text, shapes


def random_tensors(shapes, seed):
    """N(0, 0.5) values for every tensor, drawn in name order."""
    rng = np.random.default_rng(seed)
    return {n: (0.5 * rng.standard_normal(s)).astype(np.float32) for n, s in sorted(shapes.items())}


def write_tokenizer_files(d, tj):
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))


def write_checkpoint(d, variant, seed=0):
    v = VARIANTS[variant]
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    tj = tokenizer_json()
    text, shapes = text_config_and_shapes(v, len(tj["model"]["vocab"]) + v.get("extra_vocab", 0))
    config = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4", "text_config": text,
              "tie_word_embeddings": True, "dtype": "float32"}
    (d / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer_files(d, tj)
    cdu.write_safetensors(d / "model.safetensors", random_tensors(shapes, seed))


# ---------------------------------------------------------------------------------------------- the run
def peer_file_contradicts_itself(variant, args, ref, got):
    """When the files differ: is llama.cpp's file at odds with its own tensors (a key says one shape, the tensor
    has another) while tandem's runs? Then the difference is the peer converter's defect, not ours: a line
    saying so (not counted as a failure), else None. Seen with transformers 5.17 on the E2B-style checkpoint:
    llama.cpp's converter wrote gemma4.attention.head_count_kv = 2 for every layer where the global layers'
    k_proj has 1 head, and llama.cpp's own loader refuses that file (check_tensor_dims: wrong shape)."""
    rc_ref, _, e_ref = cdu.run_tandem(args.tandem, ["generate", "-m", ref, "--prompt-ids", PROMPT_IDS, "-n", "2",
                                                    "--temp", "0"])
    rc_got, _, _ = cdu.run_tandem(args.tandem, ["generate", "-m", got, "--prompt-ids", PROMPT_IDS, "-n", "2",
                                                "--temp", "0"])
    if rc_ref != 0 and "has shape" in e_ref and rc_got == 0:
        return (f"PEER-DEFECT {variant}: llama.cpp's file contradicts its own tensors ({cdu.last_line(e_ref)}); "
                f"tandem's file runs; the key/tensor differences are in {variant}_diff.txt")
    return None


def run_variant(variant, args, work, out_dir):
    hf = work / variant
    write_checkpoint(hf, variant)
    ref, got = out_dir / f"{variant}.llamacpp.gguf", out_dir / f"{variant}.tandem.gguf"
    fail = cdu.convert_both(variant, args.python, args.llama_src, args.tandem, hf, ref, got, work, out_dir)
    if fail:
        return fail
    trim = VARIANTS[variant].get("extra_vocab", 0) > 0

    def tandem_rows_are_the_token_count(f):  # with extra config rows, tandem trims to the tokenizer's count
        from gguf import GGUFReader
        bad, n_tok = 0, len(tokenizer_json()["model"]["vocab"])
        for t in GGUFReader(str(got)).tensors:
            if t.name in VOCAB_ROW_TENSORS and int(t.shape[-1]) != n_tok:
                bad += 1
                print("TENSOR", t.name, "tandem has", int(t.shape[-1]), "rows, the tokenizer", n_tok, file=f)
        print("INFO " + TRIMMED.replace("\n", " "), file=f)
        return bad

    fail, summary, info = cdu.compare_files(variant, ref, got, "gemma4", out_dir / f"{variant}_diff.txt",
                                            rows_may_differ=VOCAB_ROW_TENSORS if trim else (),
                                            extra_check=tandem_rows_are_the_token_count if trim else None)
    if fail:
        return peer_file_contradicts_itself(variant, args, ref, got) or fail
    if trim:
        return f"PASS {variant}: {summary} ({info} tokenizer keys differ, INFO); token rows as noted in the diff"
    # llama.cpp's file runs in tandem exactly as tandem's own: the same greedy ids and the same logits bytes.
    runs = []
    for path in (ref, got):
        dump = Path(str(path) + ".logits")
        rc, out, e = cdu.run_tandem(args.tandem, ["generate", "-m", path, "--prompt-ids", PROMPT_IDS,
                                                  "-n", N_GREEDY, "--temp", "0", "--dump-logits", dump])
        if rc != 0:
            return f"FAIL {variant}: tandem generate on {path.name} exited {rc}: {cdu.last_line(e)}"
        runs.append((out, dump.read_bytes()))
    if runs[0] != runs[1]:
        return f"FAIL {variant}: {summary}, but tandem runs llama.cpp's file differently from its own"
    line = (f"PASS {variant}: {summary} ({info} tokenizer keys differ, INFO); tandem runs llama.cpp's file with "
            f"the same ids and logits ({len(runs[0][1])} bytes) as its own")
    if args.llama_bin:  # and llama.cpp runs tandem's file: its prompt logits and greedy ids against tandem's
        import llamacpp_runs_fixtures as lf
        rows = cdu.read_tandem_logits(runs[1][1])
        n_prompt = len(PROMPT_IDS.split(","))
        want_greedy = [int(np.argmax(r)) for r in rows[n_prompt - 1:]][:N_GREEDY]
        ids = [int(i) for i in PROMPT_IDS.split(",")]
        own = lf.dump(args.probe, ref, N_GREEDY, ids, lbin=args.llama_bin)
        got = lf.dump(args.probe, got, N_GREEDY, ids, lbin=args.llama_bin)
        worst = max(lf.row_rel_error(g, w) for g, w in zip(got["logits"], rows[:n_prompt]))
        ok = worst <= CROSS_TOL and got["greedy"] == want_greedy and len(got["logits"]) == n_prompt
        same = own == got
        greedy = "equal" if got["greedy"] == want_greedy else f"differ: {got['greedy']} vs {want_greedy}"
        line += (f"\n{'PASS' if ok and same else 'FAIL'} {variant}: llama.cpp runs tandem's file "
                 f"{'exactly as' if same else 'NOT as'} its own converter's file; prompt logits max row relative "
                 f"error {worst:.2e} vs tandem's (tol {CROSS_TOL:g}), {N_GREEDY} greedy ids {greedy}")
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem")
    ap.add_argument("--llama-src")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs llama.cpp's converter")
    ap.add_argument("--out", default="out/gemma4_convert_diff")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--llama-bin", help="a llama.cpp build/bin with libllama.so: llama.cpp also runs tandem's files")
    ap.add_argument("--diff", nargs=2, metavar=("REF", "GOT"))
    ap.add_argument("--trimmed-rows", action="store_true",
                    help="with --diff: the token-row tensors may differ in rows (a checkpoint whose vocabulary "
                         "sizes exceed the tokenizer's count; TRIMMED above); their common rows must be equal")
    ap.add_argument("--write-checkpoint", nargs=2, metavar=("DIR", "VARIANT"))
    args = ap.parse_args()
    if args.llama_src:
        sys.path.insert(0, str(Path(args.llama_src) / "gguf-py"))  # gguf_diff's GGUFReader
    if args.diff:
        rows = VOCAB_ROW_TENSORS if args.trimmed_rows else ()
        if rows:
            print("INFO " + TRIMMED.replace("\n", " "))
        sys.exit(1 if cdu.gguf_diff(*args.diff, "gemma4", rows_may_differ=rows) else 0)
    if args.write_checkpoint:
        write_checkpoint(*args.write_checkpoint)
        return
    if not args.tandem or not args.llama_src:
        ap.error("--tandem and --llama-src are required (or --diff / --write-checkpoint)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.llama_bin:
        import llamacpp_runs_fixtures as lf
        args.probe = lf.build_probe(args.llama_src, args.llama_bin, out_dir)
    with tempfile.TemporaryDirectory() as t:
        status = cdu.run_all("gemma4_convert_diff", args.variants.split(","),
                             lambda v: run_variant(v, args, Path(t), out_dir))
    sys.exit(status)


if __name__ == "__main__":
    main()
