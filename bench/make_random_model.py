#!/usr/bin/env python3
"""Writes a randomly initialised Hugging Face Qwen3 checkpoint of a real model's shape (config.json,
model*.safetensors in bf16, and a small byte-level BPE tokenizer.json), for `tandem convert`.

The weights come from transformers' own initialisation (normal, std = initializer_range), made on the GPU when
there is one (an 8B model initialises in seconds there, minutes on the CPU). The tokenizer has 256 byte tokens
and two special tokens, and every other id up to vocab_size is a plain word token (" w<id>", reached by no merge):
random weights pick ids all over the vocabulary, and each generated token must decode to text, or a server
streams nothing for it (bench/serve_load.py counts tokens by the streamed text).

usage: make_random_model.py {qwen3-0.6b,qwen3-8b} OUT_DIR [--seed N] [--layers N]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import byte_level_tokenizer as blt  # noqa: E402

SHAPES = {
    # Qwen3-0.6B and Qwen3-8B (their config.json, without the weights).
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6),
}


def write_tokenizer(out_dir, n_vocab):
    """256 byte tokens, two specials (tests/reference/byte_level_tokenizer.py's shape), then word tokens."""
    m = blt.bytes_to_unicode()
    vocab = {m[b]: b for b in range(256)}
    space = m[ord(" ")]
    vocab.update({f"{space}w{i}": i for i in range(258, n_vocab)})
    added = [blt.added_token(256, "<|endoftext|>"), blt.added_token(257, "<|im_start|>")]
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(blt.byte_level_tokenizer_json(vocab, [], added), f)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (0: the real one)")
    a = ap.parse_args()

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = dict(SHAPES[a.shape])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    config = Qwen3Config(**cfg, attention_bias=False)
    torch.manual_seed(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    os.makedirs(a.out_dir, exist_ok=True)
    model.save_pretrained(a.out_dir, max_shard_size="50GB")  # safetensors, one file
    write_tokenizer(a.out_dir, cfg["vocab_size"])
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out_dir}: {a.shape}, {n / 1e9:.3f} B parameters, bf16, initialised on {device}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
