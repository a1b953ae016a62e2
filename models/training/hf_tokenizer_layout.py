"""The tokenizer.json layout of tandem's small models (Python standard library only, so tools without PyTorch
can use it): byte-level BPE, NFC, the Qwen2 pre-tokenizer regex, <|endoftext|> = id 0 as BOS/EOS."""

EOT = "<|endoftext|>"
# Qwen2 / Qwen3 pre-tokenizer: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines, spaces. (tokenizer.ggml.pre = "qwen2")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer_json(vocab, merges, special_ids):
    """The whole tokenizer.json document for `vocab` (text -> id), `merges` ("a b" strings) and the ids that
    are special (added) tokens."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in sorted(vocab.items(), key=lambda x: x[1]) if i in set(special_ids)]
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            dict(level)]},
        "post_processor": dict(level),
        "decoder": dict(level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
