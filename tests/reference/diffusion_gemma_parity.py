#!/usr/bin/env python3
"""tandem's diffusion-gemma canvas logits against transformers' DiffusionGemmaForBlockDiffusion (issue 17).

Per spec: a seeded random DiffusionGemma model (float32, eager attention; gemma4 text backbone with sliding
and full layers, a window narrower than the prompt, random decoder and encoder layer scalars), saved with
save_pretrained, a byte-level tokenizer.json with a <mask> token written next to it, converted with
`tandem convert --type f32`. transformers then gives the canvas logits of 3 denoising steps over one prompt:
step 0 without self-conditioning, steps 1 and 2 with SC of the previous step's logits at 1/t = 1.25, 2.0 (when
this transformers version's forward takes previous logits; otherwise only step 0 is compared and the log says
so). The result is a fixture directory (<spec>.gguf + <spec>.json); tandem's own test binary compares against
it (tests/test_diffusion_gemma_hf_fixture.cpp, env TANDEM_DG_FIXTURE = the directory, placement from
TANDEM_DG_PLACEMENT: cpu, cuda, layer, tensor), UNIFIED and PREFILL+DECODE, host and device SC, max relative
error <= 1e-3 per row.

transformers 5.17 specifics the script does not assume but probes, printing what it found and did:
  - the class and config names (any transformers attribute containing "DiffusionGemma");
  - the vision_config workaround: None, then {}, then a minimal vision config dict;
  - where canvas_length / mask_token_id live (written into generation_config.json as well, so convert finds
    them);
  - the forward's signature (how the prompt, the canvas and the previous logits are passed).
--fixtures DIR: copies the tiny spec's fixture there for CI (tests/data/models/).
"""

import argparse
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import byte_level_tokenizer as blt  # noqa: E402

TOL = 1e-3
PROMPT_LEN = 12
TEMP_INV = [1.0, 1.25, 2.0]

SPECS = [
    dict(name="diffusion_gemma_tiny", vocab=300, hidden=64, layers=4, heads=4, kv=2, head_dim=16,
         global_head_dim=32, global_kv=2, ff=128, window=4, softcap=30.0, canvas=8, fixture=True),
    dict(name="diffusion_gemma_small", vocab=1024, hidden=256, layers=6, heads=8, kv=4, head_dim=32,
         global_head_dim=64, global_kv=2, ff=512, window=8, softcap=30.0, canvas=32),
    # The 26B-A4B shape (GGUF-ARCH-FACTS C.1/C.5) with 2 of its 30 layers (one sliding, one global): vocab
    # 262144, n_embd 2816, 128 experts of 704, top 8; canvas 16 (its logits go to a binary file).
    dict(name="diffusion_gemma_26b_a4b_2l", vocab=262144, hidden=2816, layers=2, heads=16, kv=8, head_dim=256,
         global_head_dim=512, global_kv=2, ff=2112, window=1024, softcap=30.0, canvas=16, experts=128, top_k=8,
         expert_ff=704),
]
# Fixtures with more logits than this keep them in <spec>.f32 (steps x canvas x vocab float32) beside the json.
INLINE_LOGITS_MAX = 200_000

LOG = None


def log(msg):
    print(msg, flush=True)
    if LOG:
        LOG.write(msg + "\n")
        LOG.flush()


# ---- tokenizer (byte-level BPE, GPT-2 byte map) ----


def write_tokenizer(d, vocab_size):
    """256 byte tokens, "he", <mask> (id 257), then filler tokens up to vocab_size."""
    m = blt.bytes_to_unicode()
    vocab = {m[b]: b for b in range(256)}
    vocab["he"] = 256
    for i in range(258, vocab_size):
        vocab[f"tok{i}"] = i
    tok = blt.byte_level_tokenizer_json(vocab, ["h e"], [blt.added_token(257, "<mask>")])
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": None,
                                                         "mask_token": "<mask>"}))
    return 257


# ---- transformers ----


def find_classes():
    import transformers
    names = [n for n in dir(transformers) if "diffusiongemma" in n.lower().replace("_", "")]
    log(f"transformers {transformers.__version__}: DiffusionGemma names: {names}")
    model_cls = None
    for n in ("DiffusionGemmaForBlockDiffusion", "DiffusionGemma4ModelForBlockDiffusion",
              "DiffusionGemma4ForBlockDiffusion"):
        if hasattr(transformers, n):
            model_cls = getattr(transformers, n)
            break
    cfg_cls = None
    for n in ("DiffusionGemmaConfig", "DiffusionGemma4Config"):
        if hasattr(transformers, n):
            cfg_cls = getattr(transformers, n)
            break
    if model_cls is None:
        raise RuntimeError(f"no DiffusionGemma model class in transformers {transformers.__version__}")
    if cfg_cls is None:
        cfg_cls = getattr(model_cls, "config_class", None)
    log(f"model class {model_cls.__name__}, config class {getattr(cfg_cls, '__name__', None)}")
    try:
        log(f"config signature: {inspect.signature(cfg_cls.__init__)}")
    except (TypeError, ValueError):
        pass
    return model_cls, cfg_cls


def text_config(spec):
    L = spec["layers"]
    types = ["sliding_attention" if (i % 3) != 2 else "full_attention" for i in range(L)]
    types[-1] = "full_attention"
    return dict(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["ff"], num_hidden_layers=L,
        num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"], head_dim=spec["head_dim"],
        # DiffusionGemmaTextConfig (5.17) pops global_head_dim / num_global_key_value_heads into per_layer_config;
        # final_logit_softcapping is a class attribute (30.0), not an argument; full layers have no v_proj.
        global_head_dim=spec["global_head_dim"], num_global_key_value_heads=spec["global_kv"],
        sliding_window=spec["window"], layer_types=types,
        # 5.17 builds the router and experts in every layer (D.2): num_experts=None fails in torch.empty.
        num_experts=spec.get("experts", 4), top_k_experts=spec.get("top_k", 2),
        moe_intermediate_size=spec.get("expert_ff", max(8, spec["ff"] // 2)),
        tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=4096,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}}), types


# transformers 5.17 builds the vision tower unconditionally (vision_config=None fails at model construction):
# a tiny gemma4_vision config (fields of Gemma4VisionConfig) works around it.
MIN_VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
                  position_embedding_size=64)


def make_model(model_cls, cfg_cls, spec, mask_id):
    """The config and the model: the first vision_config variant with which both can be built."""
    import copy
    text, types = text_config(spec)
    last = None
    for label, vision in (("minimal gemma4_vision config", MIN_VISION), ("vision_config=None", None),
                          ("vision_config={}", {})):
        for extra in (dict(canvas_length=spec["canvas"], mask_token_id=mask_id), dict(canvas_length=spec["canvas"])):
            try:
                cfg = cfg_cls(text_config=copy.deepcopy(text), vision_config=copy.deepcopy(vision),
                              tie_word_embeddings=True, **extra)
                try:
                    cfg._attn_implementation = "eager"
                    cfg.text_config._attn_implementation = "eager"
                except Exception:  # noqa: BLE001
                    pass
                model = model_cls(cfg).float().eval()
                log(f"config + model built with {label}, extra {list(extra)}")
                return cfg, model, types
            except Exception as e:  # noqa: BLE001 - the next variant is tried
                last = e
                log(f"{label} {list(extra)} failed: {type(e).__name__}: {str(e)[:300]}")
    raise RuntimeError(f"no config variant worked: {last}")


def randomize(model):
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name:
                continue
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * (torch.rand_like(p) * 2 - 1))
            else:
                fan_in = p.shape[-1]
                scale = 3.0 if "embed_tokens" in name else 1.5
                p.copy_((torch.rand_like(p) * 2 - 1) * scale / math.sqrt(fan_in))
        for name, b in list(model.named_buffers()) + list(model.named_parameters()):
            if name.endswith("layer_scalar"):
                lo = 1.0 if "encoder" in name else 0.6
                b.copy_(lo + 0.5 * torch.rand_like(b))


def make_hf(spec, work, seed):
    import torch
    model_cls, cfg_cls = find_classes()
    hf_dir = work / "hf"
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    hf_dir.mkdir(parents=True)
    mask_id = write_tokenizer(hf_dir, spec["vocab"])
    torch.manual_seed(seed)
    cfg, model, types = make_model(model_cls, cfg_cls, spec, mask_id)
    randomize(model)
    sd = model.state_dict()
    keys = list(sd.keys())
    log(f"state dict: {len(keys)} entries; non-layer: {[k for k in keys if '.layers.' not in k][:20]}")
    log(f"layer 0 entries: {[k for k in keys if '.layers.0.' in k][:40]}")
    log(f"forward signature: {inspect.signature(model.forward)}")
    model.save_pretrained(hf_dir, safe_serialization=True)
    # canvas_length / mask_token_id where the converter looks, whatever the config class did with them.
    gpath = hf_dir / "generation_config.json"
    gen = json.loads(gpath.read_text()) if gpath.exists() else {}
    gen.setdefault("canvas_length", spec["canvas"])
    gen.setdefault("mask_token_id", mask_id)
    gpath.write_text(json.dumps(gen, indent=1))
    log(f"config.json: {json.dumps(json.loads((hf_dir / 'config.json').read_text()))[:1500]}")
    return model, hf_dir, mask_id


def call_variants(model, prompt, canvas, prev):
    """Yields (label, callable) ways of running one UNIFIED canvas forward on this transformers version."""
    import torch
    params = set(inspect.signature(model.forward).parameters)
    # 5.17: self_conditioning_logits (and self_conditioning_mask, which is not the logits).
    sc_names = sorted((p for p in params if any(s in p for s in ("self_cond", "sc_logits", "prev_logits",
                                                                 "previous_logits")) and "mask" not in p),
                      key=lambda p: (0 if p == "self_conditioning_logits" else 1 if "logits" in p else 2, p))
    canvas_names = [p for p in ("decoder_input_ids", "canvas_ids", "canvas_input_ids", "noisy_input_ids")
                    if p in params]
    sc_kw = {}
    if prev is not None:
        if not sc_names:
            return
        sc_kw = {sc_names[0]: prev}
    for cn in canvas_names:
        yield f"input_ids=prompt, {cn}=canvas {list(sc_kw)}", \
            lambda cn=cn: model(input_ids=prompt, **{cn: canvas}, **sc_kw)
    yield f"input_ids=[prompt|canvas] {list(sc_kw)}", \
        lambda: model(input_ids=torch.cat([prompt, canvas], dim=1), **sc_kw)


def hf_canvas_logits(model, prompt, canvas, prev, C):
    errors = []
    for label, fn in call_variants(model, prompt, canvas, prev):
        try:
            import torch
            with torch.no_grad():
                out = fn()
            logits = out.logits if hasattr(out, "logits") else out[0]
            logits = logits[0].float().cpu()
            if logits.shape[0] < C:
                raise RuntimeError(f"logits have {logits.shape[0]} rows, fewer than the canvas {C}")
            return label, logits[-C:]
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
    raise RuntimeError("no forward variant worked: " + " | ".join(errors) if errors else
                       "the forward takes no previous logits (self-conditioning)")


def run_spec(spec, args, results):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    work = Path(args.work) / spec["name"]
    work.mkdir(parents=True, exist_ok=True)
    model, hf_dir, mask_id = make_hf(spec, work, 1234)
    gguf = work / f"{spec['name']}.gguf"
    t0 = time.time()
    p = subprocess.run([args.tandem, "convert", str(hf_dir), "-o", str(gguf), "--type", "f32", "-q"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log(f"tandem convert [{time.time() - t0:.1f}s rc {p.returncode}]: {p.stdout[-1500:]}")
    if p.returncode != 0:
        raise RuntimeError("tandem convert failed")
    g = torch.Generator().manual_seed(99)
    V, C = spec["vocab"], spec["canvas"]
    prompt = torch.randint(0, V, (PROMPT_LEN,), generator=g).tolist()
    steps = []
    prev = None
    for k in range(3):
        canvas = [mask_id if torch.rand(1, generator=g).item() < 0.5 else int(torch.randint(0, V, (1,), generator=g))
                  for _ in range(C)]
        try:
            label, logits = hf_canvas_logits(model, torch.tensor([prompt]), torch.tensor([canvas]),
                                             None if k == 0 else (prev * TEMP_INV[k]).unsqueeze(0), C)
        except Exception as e:  # noqa: BLE001
            if k == 0:
                raise
            log(f"step {k}: no SC forward ({e}); comparing step 0 only")
            break
        log(f"step {k}: transformers ran '{label}'")
        steps.append({"canvas": canvas, "use_sc": k > 0, "temp_inv": TEMP_INV[k], "logits": logits.tolist(),
                      "max_abs_logit": float(logits.abs().max())})
        prev = logits
    fx = work / "fixture"
    fx.mkdir(exist_ok=True)
    shutil.move(str(gguf), fx / gguf.name)  # moved, not copied: the 26B-shape file is ~9 GB
    head = {"prompt": prompt, "canvas_length": C, "mask_token": mask_id, "tolerance": TOL,
            "note": "step k > 0 was run by transformers with self_conditioning_logits = (the logits of step k-1 "
                    "in this file) * temp_inv of step k; a check gives tandem the same previous logits "
                    "(CanvasSource::set_sc_logits) so that every step is compared alone",
            "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    if len(steps) * C * V > INLINE_LOGITS_MAX:
        import array
        with open(fx / f"{spec['name']}.f32", "wb") as f:
            for st in steps:
                f.write(array.array("f", [x for row in st.pop("logits") for x in row]).tobytes())
        head["logits_f32"] = f"{spec['name']}.f32"
    head["steps"] = steps
    (fx / f"{spec['name']}.json").write_text(json.dumps(head))
    if spec.get("fixture") and args.fixtures:  # now, so that a run cut short still has it
        Path(args.fixtures).mkdir(parents=True, exist_ok=True)
        for f in fx.iterdir():
            shutil.copy(f, Path(args.fixtures) / f.name)
        log(f"fixture written to {args.fixtures}")
        if os.environ.get("DG_FIXTURE_TAR"):  # one file for the device tool to bring back
            import tarfile
            with tarfile.open(os.environ["DG_FIXTURE_TAR"], "w:gz") as tf:
                for f in sorted(Path(args.fixtures).iterdir()):
                    tf.add(f, arcname=f.name)
            log(f"fixture packed into {os.environ['DG_FIXTURE_TAR']}")
    ok = True
    res = {"spec": spec["name"], "steps": len(steps)}
    for placement in args.placements.split(","):
        env = dict(os.environ, TANDEM_DG_FIXTURE=str(fx / spec["name"]), TANDEM_DG_PLACEMENT=placement,
                   TANDEM_DG_THREADS="8")
        if spec.get("experts", 4) > 8:  # the 26B shape: device SC only, no chained runs (host SC is minutes)
            env["TANDEM_DG_MODES"] = "device"
        binary = args.gpu_tests if placement != "cpu" else args.tests
        cmd = [binary, "--gtest_filter=*DiffusionGemmaHf*"]
        t0 = time.time()
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        good = p.returncode == 0 and "[  PASSED  ] 1 test" in p.stdout and "SKIPPED" not in p.stdout
        # The detail to the log file; one line per placement to stdout: the worst error of each step compared
        # alone, and of the chain (own logits fed back, not bounded).
        per_step, chained = {}, {}
        for line in p.stdout.splitlines():
            m = re.search(r"step (\d+)( \(chained)?.*rel error ([0-9.e+-]+)", line)
            if m:
                d = chained if m.group(2) else per_step
                d[int(m.group(1))] = max(d.get(int(m.group(1)), 0.0), float(m.group(3)))
        detail = "\n".join(l for l in p.stdout.splitlines() if "error" in l.lower() or "rel" in l or "FAIL" in l
                           or "Skipped" in l)[-3000:]
        if LOG:
            LOG.write(detail + "\n")
        fmt = lambda d: " ".join(f"{d[k]:.1e}" for k in sorted(d)) or "-"  # noqa: E731
        log(f"  {spec['name']} {placement}: {'PASS' if good else 'FAIL'} [{time.time() - t0:.1f}s] per step "
            f"{fmt(per_step)}; chained {fmt(chained)}")
        if not good:
            print("\n".join(l for l in p.stdout.splitlines() if "Failure" in l or "Expected" in l or "rror" in l)
                  [-1500:], flush=True)
        res[placement] = good
        ok = ok and good
    res["pass"] = ok
    results.append(res)
    if not spec.get("fixture"):  # the large files are not kept (the 26B shape: ~9 GB each)
        shutil.rmtree(work, ignore_errors=True)
    return ok


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--tests", required=True, help="tandem_tests binary (cpu placement)")
    ap.add_argument("--gpu-tests", required=True, help="tandem_gpu_tests binary (cuda, layer, tensor)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/tandem_dg_parity")
    ap.add_argument("--placements", default="cpu,cuda,layer,tensor")
    ap.add_argument("--only", default="")
    ap.add_argument("--fixtures", default="")
    ap.add_argument("--big", action="store_true", help="also the 26B-A4B-shape spec (~2 minutes)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    LOG = open(out / "diffusion_gemma_parity.log", "w")
    results, all_ok = [], True
    for spec in SPECS:
        if args.only and spec["name"] not in args.only.split(","):
            continue
        if not args.only and spec.get("experts", 4) > 8 and not args.big:
            log(f"== {spec['name']}: skipped (--big runs it)")
            continue
        log(f"== {spec['name']}")
        t0 = time.time()
        try:
            all_ok = run_spec(spec, args, results) and all_ok
        except Exception:  # noqa: BLE001
            all_ok = False
            log(traceback.format_exc())
            results.append({"spec": spec["name"], "pass": False, "error": traceback.format_exc()[-800:]})
        log(f"   ({time.time() - t0:.1f}s)")
    (out / "diffusion_gemma_parity.json").write_text(json.dumps(results, indent=1))
    summary = "\n".join(f"{r['spec']}: {'PASS' if r['pass'] else 'FAIL'}" for r in results)
    (out / "diffusion_gemma_parity_summary.txt").write_text(summary + "\n")
    log(summary)
    log("diffusion-gemma parity: " + ("PASS" if all_ok else "FAIL"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
