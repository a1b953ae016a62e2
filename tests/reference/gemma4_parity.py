#!/usr/bin/env python3
"""tandem's gemma4 forward pass against transformers' Gemma4ForCausalLM on random weights (issue 16).

For each spec: a seeded random Gemma4TextConfig (sliding and full-attention layers with their own head dims and
KV heads, attention_k_eq_v so full layers have no v_proj (V = K), proportional partial rope on full layers,
final logit softcap, random layer_scalar), weights re-drawn so the logits are peaky, float32, eager attention.
The GGUF is written here by a small standalone writer with the keys and tensor names of GGUF-ARCH-FACTS C.1/C.2
(it does not use `tandem convert`). Then `tandem generate` (greedy, f32 KV, --dump-logits) runs on each
placement: cpu, cuda:0, --split-mode layer and tensor over --devices cuda:0,cuda:0 (tensor with --replicate-kv when
a layer has fewer than 2 KV heads, as gemma4_tiny's global layers). Checks per placement:
  - the logits of the prompt and of the 32 greedy steps against transformers run teacher-forced on tandem's
    tokens: max relative error <= 1e-3 (relative error of a row: max|tandem - hf| / max|hf|);
  - the 32 greedy tokens equal transformers' own greedy continuation.
--fixtures DIR: writes <spec>.gguf and <spec>.json (prompt, transformers' logits of every prompt row and the
greedy tokens) for CI (tests/data/models/).
MoE specs (moe=...) turn on transformers' enable_moe_block (num_experts, top_k_experts, moe_intermediate_size:
every layer gets the router, the experts and the extra norms beside its dense MLP, GGUF-ARCH-FACTS C.5); the
router weights are drawn large so that the top-k is decisive (no near-ties between tandem and torch). For MoE
specs the checkpoint is also saved (save_pretrained + a tokenizer.json of the model's vocabulary size) and converted with
`tandem convert --type f32`; the converted file must give the writer's file's logits (placement "convert",
run on cuda:0). The config actually used is printed (transformers' field names are checked after
construction: a config that silently ignored a field fails the spec).
E2B-style specs (ple=...: hidden_size_per_layer_input, num_kv_shared_layers) run cpu, cuda and tensor only
(tandem refuses to split such a model by layer); their layer pattern makes C.7's fixed KV sources (n - s - 2
sliding, n - s - 1 full) the last own-KV layer of each kind, as transformers picks them.
"""

import argparse
import json
import math
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

TOL = 1e-3
N_GREEDY = 32
PROMPT_LEN = 24

SPECS = [
    dict(name="gemma4_tiny", vocab=256, hidden=64, layers=4, heads=4, kv=2, head_dim=16, global_head_dim=32,
         global_kv=1, ff=128, window=8, softcap=30.0, fixture=True),
    dict(name="gemma4_small", vocab=1024, hidden=256, layers=6, heads=8, kv=4, head_dim=32, global_head_dim=64,
         global_kv=2, ff=512, window=16, softcap=30.0),
    # The 26B-A4B attention/dense shape with few layers and its MoE block left out.
    dict(name="gemma4_26b_a4b_dense_part", vocab=4096, hidden=2816, layers=3, heads=16, kv=8, head_dim=256,
         global_head_dim=512, global_kv=2, ff=2112, window=1024, softcap=30.0),
    # Mixture of experts (C.5): a small shape (CI fixture) and the 26B-A4B shape with 2 layers (128 experts,
    # top 8, expert n_ff 704; f32 weights: about 3 GB per layer).
    dict(name="gemma4_moe_tiny", vocab=512, hidden=64, layers=4, heads=4, kv=2, head_dim=16, global_head_dim=32,
         global_kv=2, ff=128, window=8, softcap=30.0, moe=dict(experts=8, top_k=2, ff=16), fixture=True,
         convert=True),
    dict(name="gemma4_moe_small", vocab=1024, hidden=256, layers=4, heads=8, kv=4, head_dim=32,
         global_head_dim=64, global_kv=2, ff=512, window=16, softcap=30.0, moe=dict(experts=16, top_k=4, ff=128),
         convert=True),
    dict(name="gemma4_e2b_tiny", vocab=512, hidden=64, layers=6, heads=4, kv=2, head_dim=16, global_head_dim=32,
         global_kv=2, ff=128, window=8, softcap=30.0, ple=dict(n=8, shared=3), placements="cpu,cuda,tensor"),
    dict(name="gemma4_26b_a4b_moe", vocab=4096, hidden=2816, layers=2, heads=16, kv=8, head_dim=256,
         global_head_dim=512, global_kv=2, ff=2112, window=1024, softcap=30.0,
         moe=dict(experts=128, top_k=8, ff=704)),
]

# ---- GGUF writer (GGUF v3, little endian) ----
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _val(kind, v):
    if kind == T_U32:
        return struct.pack("<I", v)
    if kind == T_I32:
        return struct.pack("<i", v)
    if kind == T_F32:
        return struct.pack("<f", v)
    if kind == T_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if kind == T_STR:
        return _str(v)
    raise ValueError(kind)


def write_gguf(path, kv, tensors):
    """kv: [(key, kind, value)] (arrays: kind = (T_ARR, elem_kind)); tensors: [(name, ne list, f32 bytes)]."""
    align = 32
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, kind, v in kv:
        out += _str(key)
        if isinstance(kind, tuple):
            out += struct.pack("<IIQ", T_ARR, kind[1], len(v))
            for x in v:
                out += _val(kind[1], x)
        else:
            out += struct.pack("<I", kind) + _val(kind, v)
    offset = 0
    offsets = []
    for name, ne, data in tensors:
        offsets.append(offset)
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", 0, offset)  # type 0 = F32
        offset += (len(data) + align - 1) // align * align
    out += b"\0" * ((-len(out)) % align)
    base = len(out)
    for (name, ne, data), off in zip(tensors, offsets):
        out += b"\0" * (base + off - len(out))
        out += data
    Path(path).write_bytes(bytes(out))


# ---- transformers model ----


def make_hf(spec, seed, device):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    torch.manual_seed(seed)
    L = spec["layers"]
    types = ["sliding_attention" if (i % 3) != 2 else "full_attention" for i in range(L)]
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    moe = spec.get("moe")
    moe_kw = dict(enable_moe_block=False)
    ple = spec.get("ple")
    ple_kw = dict(hidden_size_per_layer_input=0, num_kv_shared_layers=0)
    if ple:
        ple_kw = dict(hidden_size_per_layer_input=ple["n"], num_kv_shared_layers=ple["shared"],
                      vocab_size_per_layer_input=spec["vocab"])
    if moe:
        moe_kw = dict(enable_moe_block=True, num_experts=moe["experts"], top_k_experts=moe["top_k"],
                      moe_intermediate_size=moe["ff"])
    cfg = Gemma4TextConfig(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["ff"], num_hidden_layers=L,
        num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"], head_dim=spec["head_dim"],
        global_head_dim=spec["global_head_dim"], num_global_key_value_heads=spec["global_kv"],
        attention_k_eq_v=True, sliding_window=spec["window"], layer_types=types,
        final_logit_softcapping=spec["softcap"], **ple_kw,
        tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=4096, **moe_kw,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}})
    cfg._attn_implementation = "eager"
    for key, want in moe_kw.items():  # a field the config does not know would be silently dropped
        try:
            got = getattr(cfg, key, None)
        except Exception:  # noqa: BLE001 -- a per-layer field: checked through the model's parameters below
            continue
        if got != want:
            raise RuntimeError(f"Gemma4TextConfig.{key} is {got!r}, expected {want!r}: transformers' MoE field "
                               f"names differ from this script's")
    def field(k):  # transformers 5.17 raises (not AttributeError) for per-layer fields read globally
        try:
            return getattr(cfg, k, None)
        except Exception as e:  # noqa: BLE001
            return f"<per-layer: {type(e).__name__}>"

    used = {k: field(k) for k in
            ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "global_head_dim", "num_global_key_value_heads",
             "attention_k_eq_v", "sliding_window", "layer_types", "final_logit_softcapping", "enable_moe_block",
             "num_experts", "top_k_experts", "moe_intermediate_size", "rope_parameters"]}
    print(f"  config used: {json.dumps(used, default=str)}", flush=True)
    model = Gemma4ForCausalLM(cfg).float().eval()
    layer0 = sorted(k for k in model.state_dict() if k.startswith("model.layers.0."))
    if ple and not any("per_layer" in k for k in layer0):
        raise RuntimeError(f"hidden_size_per_layer_input gave no per-layer-input parameters; layer 0 has: {layer0}")
    if moe and not any(".experts." in k or ".router." in k for k in layer0):
        # PretrainedConfig keeps unknown keyword arguments as attributes, so the check above cannot see a
        # misspelt MoE field; the model's parameters can.
        raise RuntimeError(f"enable_moe_block gave no router/experts parameters; layer 0 has: {layer0}")
    print(f"  layer 0 parameters: {layer0}", flush=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.proj.weight"):  # decisive top-k: logits with a spread of several units
                p.copy_((torch.rand_like(p) * 2 - 1) * 9.0)
            elif p.dim() == 1:  # norm weights and the router / per-expert scales: around 1
                p.copy_(1.0 + 0.3 * (torch.rand_like(p) * 2 - 1))
            else:
                fan_in = p.shape[-1]
                scale = 3.0 if "embed_tokens" in name else 1.5
                p.copy_((torch.rand_like(p) * 2 - 1) * scale / math.sqrt(fan_in))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.6 + 0.8 * torch.rand_like(b))
    return model.to(device), cfg, types


def to_gguf(model, cfg, types, spec, path):
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    L = spec["layers"]
    sliding = [t == "sliding_attention" for t in types]
    kv = [
        ("general.architecture", T_STR, "gemma4"),
        ("gemma4.context_length", T_U32, 4096),
        ("gemma4.embedding_length", T_U32, spec["hidden"]),
        ("gemma4.block_count", T_U32, L),
        ("gemma4.feed_forward_length", T_U32, spec["ff"]),
        ("gemma4.attention.head_count", T_U32, spec["heads"]),
        ("gemma4.attention.head_count_kv", (T_ARR, T_I32),
         [spec["kv"] if s else spec["global_kv"] for s in sliding]),
        ("gemma4.attention.key_length", T_U32, spec["global_head_dim"]),
        ("gemma4.attention.value_length", T_U32, spec["global_head_dim"]),
        ("gemma4.attention.key_length_swa", T_U32, spec["head_dim"]),
        ("gemma4.attention.value_length_swa", T_U32, spec["head_dim"]),
        ("gemma4.rope.dimension_count", T_U32, spec["global_head_dim"]),
        ("gemma4.rope.dimension_count_swa", T_U32, spec["head_dim"]),
        ("gemma4.rope.freq_base", T_F32, 1000000.0),
        ("gemma4.rope.freq_base_swa", T_F32, 10000.0),
        ("gemma4.attention.sliding_window", T_U32, spec["window"]),
        ("gemma4.attention.sliding_window_pattern", (T_ARR, T_BOOL), sliding),
        ("gemma4.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        ("gemma4.attention.shared_kv_layers", T_U32, 0),
        ("gemma4.embedding_length_per_layer_input", T_U32, 0),
        ("gemma4.final_logit_softcapping", T_F32, spec["softcap"]),
    ]
    moe = spec.get("moe")
    ple = spec.get("ple")
    if ple:
        kv = [(k, t, v) for k, t, v in kv if k not in ("gemma4.embedding_length_per_layer_input",
                                                      "gemma4.attention.shared_kv_layers")]
        kv += [("gemma4.embedding_length_per_layer_input", T_U32, ple["n"]),
               ("gemma4.attention.shared_kv_layers", T_U32, ple["shared"])]
    if moe:
        kv += [("gemma4.expert_count", T_U32, moe["experts"]), ("gemma4.expert_used_count", T_U32, moe["top_k"]),
               ("gemma4.expert_feed_forward_length", T_U32, moe["ff"])]
    tensors = []

    def add(name, t):
        t = t.float().contiguous()
        tensors.append((name, list(reversed(t.shape)), t.numpy().tobytes()))

    p = "model."
    add("token_embd.weight", sd[p + "embed_tokens.weight"])
    add("output_norm.weight", sd[p + "norm.weight"])
    for hf, gg in [("embed_tokens_per_layer.weight", "per_layer_token_embd.weight"),
                   ("per_layer_model_projection.weight", "per_layer_model_proj.weight"),
                   ("per_layer_projection_norm.weight", "per_layer_proj_norm.weight")]:
        if p + hf in sd:
            add(gg, sd[p + hf])
    import torch
    D = spec["global_head_dim"]
    n_one = int(D * 0.25 / 2)
    add("rope_freqs.weight", torch.tensor([1.0] * n_one + [1e30] * (D // 2 - n_one)))
    names = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight",
             "post_attention_layernorm.weight": "post_attention_norm.weight",
             "pre_feedforward_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
             "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
             "layer_scalar": "layer_output_scale.weight",
             # C.2 / C.5: the MoE block
             "router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
             "router.per_expert_scale": "ffn_down_exps.scale",
             "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
             "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
             "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
             "experts.gate_up_proj": "ffn_gate_up_exps.weight", "experts.down_proj": "ffn_down_exps.weight",
             # C.7: per-layer inputs
             "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
             "post_per_layer_input_norm.weight": "post_norm.weight"}

    def expert_layout(hf, t):
        # torch [n_expert, out, in] is ggml {in, out, n_expert}; a checkpoint that stores [n_expert, in, out]
        # is transposed (gate_up: out = 2 * moe_ff; down: out = hidden).
        out_rows = 2 * moe["ff"] if hf == "experts.gate_up_proj" else spec["hidden"]
        if t.shape[1] != out_rows and t.shape[2] == out_rows:
            t = t.transpose(1, 2)
        if t.shape[1] != out_rows:
            raise RuntimeError(f"{hf} has shape {list(t.shape)}; expected [n_expert, {out_rows}, in]")
        return t

    for il in range(L):
        for hf, gg in names.items():
            k = f"{p}layers.{il}.{hf}"
            if k in sd:
                t = sd[k]
                if hf == "layer_scalar":
                    t = t.reshape(-1)
                elif hf.startswith("experts."):
                    t = expert_layout(hf, t)
                add(f"blk.{il}.{gg}", t)
    leftover = [k for k in sd if k.startswith(p + "layers.") and k.split(".", 3)[3] not in names
                and "rotary" not in k]
    known_top = {"embed_tokens.weight", "norm.weight", "embed_tokens_per_layer.weight",
                 "per_layer_model_projection.weight", "per_layer_projection_norm.weight"}
    leftover += [k for k in sd if k.startswith(p) and not k.startswith(p + "layers.") and
                 k[len(p):] not in known_top and "rotary" not in k]
    if leftover:
        raise RuntimeError(f"state-dict entries this writer does not map: {leftover[:6]}")
    write_gguf(path, kv, tensors)


# ---- tandem ----


def read_dump(path):
    import torch
    data = Path(path).read_bytes()
    assert data[:4] == b"TLOG", f"{path}: not a logits dump"
    n_vocab = struct.unpack_from("<I", data, 4)[0]
    body = torch.frombuffer(bytearray(data[8:]), dtype=torch.float32).view(-1, 2 + n_vocab)
    ints = body[:, :2].contiguous().view(torch.int32)
    rows = {}
    for r in range(body.shape[0]):
        rows[int(ints[r, 1])] = body[r, 2:].clone()
    return rows


def split_flags(spec, placement):
    """--replicate-kv when a tensor split over 2 ranks meets a layer with fewer than 2 KV heads."""
    if placement == "tensor" and min(spec["kv"], spec["global_kv"]) < 2:
        return ["--replicate-kv"]
    return []


def tandem_generate(tandem, gguf, prompt, work, placement, log, extra=()):
    dump = work / f"{placement.replace(':', '_').replace(',', '_').replace(' ', '_')}.logits"
    if placement == "convert":  # the file `tandem convert` made, on cuda:0
        gguf = Path(gguf).with_name(Path(gguf).stem + "_converted.gguf")
    cmd = [tandem, "generate", "-m", gguf, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(N_GREEDY),
           "--temp", "0", "--ignore-eos", "--ids", "--kv-type", "f32", "--ctx", "1024", "--dump-logits", str(dump)]
    if placement in ("cuda", "convert"):
        cmd += ["--devices", "cuda:0"]
    elif placement in ("layer", "tensor"):
        cmd += ["--devices", "cuda:0,cuda:0", "--split-mode", placement]
    cmd += list(extra)
    t0 = time.time()
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=600)
    log(f"  $ {' '.join(map(str, cmd))}  [{time.time() - t0:.1f}s rc {p.returncode}]")
    if p.returncode != 0:
        raise RuntimeError(f"tandem failed: {p.stderr.strip()[-1500:]}")
    ids = [int(x) for x in p.stdout.split()]
    rows = read_dump(dump)
    dump.unlink()
    return ids, rows


def write_sized_tokenizer(hf_dir, n_vocab):
    """A Gemma-style tokenizer.json (BPE with byte fallback, no merges) of exactly n_vocab tokens: 4 specials,
    the 256 <0xNN> byte tokens, then filler words. The converter trims token_embd to the tokenizer's size
    (as llama.cpp's does), so the tokenizer must cover the model's whole vocabulary."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    names = specials + [f"<0x{b:02X}>" for b in range(256)]
    names += [f"\u2581w{i}" for i in range(n_vocab - len(names))]
    assert len(names) == n_vocab, f"vocab {n_vocab} is smaller than the {len(names)} base tokens"
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(specials)],
           "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
           "pre_tokenizer": None, "post_processor": None,
           "decoder": {"type": "Sequence", "decoders": [
               {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"}]},
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": {t: i for i, t in enumerate(names)}, "merges": []}}
    (hf_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))


def convert_checkpoint(model, tandem, work, gguf, log):
    """save_pretrained + a tokenizer.json of the model's vocabulary size, then `tandem convert --type f32`."""
    hf_dir = work / "hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    write_sized_tokenizer(hf_dir, model.config.vocab_size)
    out = Path(gguf).with_name(Path(gguf).stem + "_converted.gguf")
    cmd = [str(tandem), "convert", str(hf_dir), "-o", str(out), "--type", "f32", "-q"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    log(f"  $ {' '.join(cmd)}  [rc {p.returncode}]")
    saved = json.loads((hf_dir / "config.json").read_text())
    log(f"  saved config.json per_layer_config: {json.dumps(saved.get('per_layer_config'))}, "
        f"head_dim {saved.get('head_dim')}, global_head_dim {saved.get('global_head_dim')}")
    if p.returncode != 0:
        raise RuntimeError(f"tandem convert failed: {p.stderr.strip()[-1500:]}")


def rel_error(a, b):
    num = (a.double() - b.double()).abs().amax(dim=-1)
    den = b.double().abs().amax(dim=-1).clamp_min(1e-30)
    return float((num / den).max())


def check_spec(spec, args, log, results):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.work) / spec["name"]
    work.mkdir(parents=True, exist_ok=True)
    model, cfg, types = make_hf(spec, 1234, dev)
    gguf = work / f"{spec['name']}.gguf"
    to_gguf(model, cfg, types, spec, gguf)
    placements = spec.get("placements", args.placements).split(",")
    convert_failed = False
    if spec.get("convert"):
        try:
            convert_checkpoint(model, args.tandem, work, gguf, log)
            placements.append("convert")
        except Exception as e:  # noqa: BLE001 - reported as its own failure
            convert_failed = True
            log(f"  {spec['name']} convert: ERROR {e}")
            results.append({"spec": spec["name"] + " convert", "pass": False, "error": str(e)[-800:]})
    g = torch.Generator().manual_seed(99)
    prompt = torch.randint(0, spec["vocab"], (PROMPT_LEN,), generator=g).tolist()
    with torch.no_grad():
        hf_greedy = model.generate(torch.tensor([prompt], device=dev), max_new_tokens=N_GREEDY, do_sample=False,
                                   use_cache=True)[0, PROMPT_LEN:].tolist()
    res = {"spec": spec["name"], "hf_greedy": hf_greedy}
    ok = not convert_failed
    for placement in placements:
        try:
            ids, rows = tandem_generate(args.tandem, gguf, prompt, work, placement, log,
                                        split_flags(spec, placement))
            seq = prompt + ids[:-1]
            with torch.no_grad():
                hf = model(torch.tensor([seq], device=dev)).logits[0].float().cpu()
            n = len(seq)
            tl = torch.stack([rows[pos] for pos in range(n)])
            err = rel_error(tl, hf)
            same = ids == hf_greedy
            good = err <= TOL and same
            ok = ok and good
            res[placement] = {"rel_error": err, "greedy_equal": same, "pass": good}
            log(f"  {spec['name']} {placement}: rel error {err:.3e}, greedy equal {same} -> "
                f"{'PASS' if good else 'FAIL'}")
        except Exception as e:  # noqa: BLE001 - reported, next placement runs
            ok = False
            res[placement] = {"error": str(e)[-500:], "pass": False}
            log(f"  {spec['name']} {placement}: ERROR {e}")
    if spec.get("fixture") and args.fixtures:
        fx = Path(args.fixtures)
        fx.mkdir(parents=True, exist_ok=True)
        (fx / gguf.name).write_bytes(gguf.read_bytes())
        with torch.no_grad():
            hf_prompt = model(torch.tensor([prompt], device=dev)).logits[0].float().cpu()
        (fx / f"{spec['name']}.json").write_text(json.dumps(
            {"prompt": prompt, "logits": hf_prompt.tolist(), "greedy": hf_greedy}))
    res["pass"] = ok
    results.append(res)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/tandem_gemma4_parity")
    ap.add_argument("--placements", default="cpu,cuda,layer,tensor")
    ap.add_argument("--only", default="")
    ap.add_argument("--fixtures", default="")
    ap.add_argument("--selftest-writer", action="store_true",
                    help="write a tiny GGUF with the standalone writer and exit (no torch needed)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "gemma4_parity.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    if args.selftest_writer:
        f32 = struct.pack("<4f", 1, 2, 3, 4)
        write_gguf(out / "writer_selftest.gguf", [("general.architecture", T_STR, "gemma4"),
                                                   ("a.b", (T_ARR, T_BOOL), [True, False])],
                   [("t", [2, 2], f32), ("u", [4], f32)])
        log(f"wrote {out / 'writer_selftest.gguf'}")
        return 0
    results = []
    all_ok = True
    for spec in SPECS:
        if args.only and spec["name"] not in args.only.split(","):
            continue
        log(f"== {spec['name']}")
        t0 = time.time()
        try:
            all_ok = check_spec(spec, args, log, results) and all_ok
        except Exception:  # noqa: BLE001
            all_ok = False
            log(traceback.format_exc())
            results.append({"spec": spec["name"], "pass": False, "error": traceback.format_exc()[-800:]})
        log(f"   ({time.time() - t0:.1f}s)")
    (out / "gemma4_parity.json").write_text(json.dumps(results, indent=1))
    summary = "\n".join(f"{r['spec']}: {'PASS' if r['pass'] else 'FAIL'}" for r in results)
    (out / "gemma4_parity_summary.txt").write_text(summary + "\n")
    log(summary)
    log("gemma4 parity: " + ("PASS" if all_ok else "FAIL"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
