"""A byte-level BPE tokenizer.json of HF format with the Qwen2-style pre-tokenizer (split regex, then byte level):
the tokenizer kind of Qwen3 checkpoints, which `tandem convert` reads as "gpt2" / pre "qwen2". One home for the
reference scripts that write small ones (dflash_convert_diff.py, diffusion_gemma_parity.py,
bench/make_random_model.py); tests/test_convert_fixture.h writes the same shape in C++."""

QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                     r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's byte -> printable character map: the 256 base tokens of every byte-level BPE vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def added_token(token_id, content, special=True):
    return {"id": token_id, "content": content, "special": special, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False}


def byte_level_tokenizer_json(vocab, merges, added):
    """The tokenizer.json object: vocab {token: id} (the byte tokens included), merges ["a b", ...], added tokens
    (added_token(...) entries)."""
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }
