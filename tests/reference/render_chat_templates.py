#!/usr/bin/env python3
"""Renders the real chat templates in tests/data/chat_templates/*.jinja over a set of conversations with
Python jinja2, configured exactly as transformers' apply_chat_template configures it
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now and
transformers' tojson), and writes the expected outputs that tests/test_chat_template.cpp compares our
interpreter with:

  tests/data/chat_templates/cases.json            the conversations and the template list
  tests/data/chat_templates/expected/<template>.<case>.<gp>.txt
                                                   the rendering (gp = add_generation_prompt 0/1), or the
                                                   first line "!error" and the message when the template raised

Run from the repo root: /usr/bin/python3 tests/reference/render_chat_templates.py (needs python3-jinja2 only).
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = os.environ.get("TANDEM_CHAT_TEMPLATES_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates")

# template file -> (bos_token, eos_token) as the model's tokenizer_config gives them
TEMPLATES = {
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "google-gemma-4-31B-it": ("<bos>", "<eos>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    # our built-ins (src/chat/builtin_templates.cpp), exported by the test as builtin-<name>.jinja
}

CASES = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ],
    "no_system_multi": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ],
    "unicode_whitespace": [
        {"role": "system", "content": "  Réponds en français.  \n"},
        {"role": "user", "content": "Grüße, 世界! 🙂 \"double\" 'single' \\ back\tslash  "},
        {"role": "assistant", "content": "  Bonjour ! 你好 🙂\n"},
        {"role": "user", "content": "Encore ?"},
    ],
    "think": [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."},
        {"role": "user", "content": "And sunsets?"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say yes."},
        {"role": "assistant", "content": "Yes."},
    ],
    "two_users": [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ],
}


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    out_dir = os.path.join(DATA, "expected")
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(f[:-6] for f in os.listdir(DATA) if f.endswith(".jinja"))
    skipped = []
    for name in names:
        bos, eos = TEMPLATES.get(name, ("<s>", "</s>"))
        with open(os.path.join(DATA, name + ".jinja"), encoding="utf-8") as f:
            try:
                template = env.from_string(f.read())
            except jinja2.exceptions.TemplateSyntaxError as e:  # e.g. transformers' own {% generation %} tag
                print(f"skipped {name}: {e}")
                skipped.append(name)
                continue
        for case, messages in CASES.items():
            for gp in (0, 1):
                try:
                    text = template.render(messages=messages, add_generation_prompt=bool(gp), bos_token=bos,
                                           eos_token=eos)
                except jinja2.exceptions.TemplateError as e:
                    text = "!error\n" + str(e)
                path = os.path.join(out_dir, f"{name}.{case}.{gp}.txt")
                with open(path, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
    with open(os.path.join(DATA, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"templates": {n: list(TEMPLATES.get(n, ("<s>", "</s>"))) for n in names if n not in skipped}, "cases": CASES}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(names) * len(CASES) * 2} renderings of {len(names)} templates to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
