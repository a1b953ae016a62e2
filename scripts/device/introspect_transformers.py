#!/usr/bin/env python3
"""Copies the installed transformers' sources for the architectures tandem checks against (DiffusionGemma,
Gemma4, the EntropyBoundSampler) into OUT, with the default configs printed, so reference scripts written on a
machine without transformers can follow the installed version exactly. Reading them is for facts only."""
import importlib, inspect, json, os, pkgutil, shutil, sys

out = sys.argv[1] if len(sys.argv) > 1 else "introspect"
os.makedirs(out, exist_ok=True)
import transformers
print("transformers", transformers.__version__)
root = os.path.dirname(transformers.__file__)
for sub in ["models/diffusion_gemma", "models/gemma4", "generation"]:
    src = os.path.join(root, sub)
    if not os.path.isdir(src):
        print("missing", src)
        continue
    for dirpath, _, files in os.walk(src):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                if sub == "generation" and "entropy" not in open(os.path.join(dirpath, f), errors="ignore").read().lower():
                    continue
                dst = os.path.join(out, rel.replace("/", "__"))
                shutil.copy(os.path.join(dirpath, f), dst)
                print("copied", rel)
for name in ["DiffusionGemmaConfig", "Gemma4Config", "Gemma4TextConfig"]:
    try:
        cls = getattr(transformers, name)
        cfg = cls()
        with open(os.path.join(out, name + ".default.json"), "w") as fh:
            fh.write(cfg.to_json_string())
        print("default config", name)
    except Exception as e:  # noqa: BLE001
        print("config", name, "failed:", repr(e))
hits = [n for n in dir(transformers) if "Diffusion" in n or "EntropyBound" in n]
print("exported names:", hits)
