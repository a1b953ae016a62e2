"""A small Gemma-style tokenizer.json built offline with HF `tokenizers`: BPE with byte_fallback trained on a tiny
corpus, no prefix space, "▁" for spaces, the 256 <0xNN> byte tokens, <pad>/<eos>/<bos>/<unk>/<start_of_turn>/
<end_of_turn> specials, decoder Sequence(Replace, ByteFallback, Fuse). It is the tokenizer kind both tandem's
converter (tokenizer.ggml.model "gemma4") and llama.cpp's Gemma4 converter (gguf.LlamaHfVocab) accept. Used by
gemma4_tokenizer_parity.py and gemma4_interop.py."""
import json
import os

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CORPUS = ["hello world", "the quick brown fox jumps over the lazy dog", "user model turn", "hello\n\nworld"] * 50


def write_gemma_tokenizer(hf_dir, vocab_size=400):
    """Writes tokenizer.json and tokenizer_config.json into hf_dir; returns the tokenizers.Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from tokenizers.trainers import BpeTrainer
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS + byte_tokens, initial_alphabet=list("▁\n"))
    tok.train_from_iterator(CORPUS, trainer)
    os.makedirs(hf_dir, exist_ok=True)
    tok.save(os.path.join(hf_dir, "tokenizer.json"))
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return tok
