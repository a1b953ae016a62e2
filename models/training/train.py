#!/usr/bin/env python3
"""Trains tandem's shipped small models: a byte-level BPE tokenizer, a Qwen3 model and a smaller draft model.

On the GPU machine (PyTorch 2.x, transformers, tokenizers): `python3 models/training/train.py --out DIR`.
Everything is deterministic up to GPU non-determinism; the training length is a wall-clock budget, so a slower
or faster GPU trains for fewer or more steps (the log records how many).

Steps:
 1. Read the corpus made by make_corpus.py (train.txt.xz, heldout.txt.xz, heldout_eval.txt).
 2. Train a byte-level BPE tokenizer (Hugging Face tokenizers; Qwen2-style pre-tokenizer regex, NFC
    normalizer, special token <|endoftext|> = id 0, used as BOS, EOS and page separator).
 3. Tokenize; every page starts with <|endoftext|>.
 4. Train the main model and the draft model together on the same random windows (bf16 autocast, AdamW, linear
    warm-up then cosine decay over the time budget), keeping the weights with the best held-out loss.
 5. Round the weights to bf16 (the shipped checkpoint), then measure the perplexity of heldout_eval.txt in fp32
    with exactly the windows `tandem perplexity` uses (see perplexity_windows below).
 6. Save Hugging Face directories (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    generation_config.json) and results.json (losses, perplexities, eval token ids, greedy continuations).

--smoke runs the same code path on a CPU with tiny models, a byte-only tokenizer (no merges) and the plain
PyTorch Qwen3 of qwen3_small.py when tokenizers / transformers are missing (PyTorch 1.13 is enough).
"""

import argparse
import json
import lzma
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_small  # noqa: E402

try:
    import tokenizers
except ImportError:
    tokenizers = None
try:
    import transformers
except ImportError:
    transformers = None

RECORD_SEP = "\n\x1e\n"
from hf_tokenizer_layout import EOT, QWEN2_PATTERN, tokenizer_json  # noqa: E402

MAIN = dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, intermediate=1280)
DRAFT = dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, intermediate=768)
SMOKE_MAIN = dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, intermediate=128)
SMOKE_DRAFT = dict(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64)

PROMPTS = ["The Python interpreter", "A dictionary is", "To install a package on Debian,",
           "SELECT name FROM", "Love, n."]


class Log:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")
        self.t0 = time.time()

    def __call__(self, *msg):
        line = "[%7.1fs] %s" % (time.time() - self.t0, " ".join(str(m) for m in msg))
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


# ---------------------------------------------------------------------------------------------------------
# Tokenizer


def bytes_to_unicode():
    """GPT-2's printable stand-in character for each byte (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ByteTokenizer:
    """Smoke-test stand-in: byte-level BPE with no merges (one token per UTF-8 byte)."""

    def __init__(self):
        self.byte_char = bytes_to_unicode()
        chars = sorted(self.byte_char.values())
        self.vocab = {EOT: 0}
        for c in chars:
            self.vocab[c] = len(self.vocab)
        self.byte_id = {b: self.vocab[c] for b, c in self.byte_char.items()}
        self.id_byte = {i: b for b, i in self.byte_id.items()}

    def encode(self, text):
        return [self.byte_id[b] for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(self.id_byte[i] for i in ids if i in self.id_byte).decode("utf-8", errors="replace")

    def vocab_size(self):
        return len(self.vocab)

    def save(self, path):
        doc = tokenizer_json(self.vocab, [], [0])
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)


class HfTokenizer:
    def __init__(self, tok):
        self.tok = tok

    @staticmethod
    def train(texts, vocab_size, log):
        from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
        tok = Tokenizer(models.BPE(byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        t = time.time()
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        log("tokenizer: trained %d tokens on %d pages in %.1fs" % (tok.get_vocab_size(), len(texts), time.time() - t))
        return HfTokenizer(tok)

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        if hasattr(self.tok, "encode_batch_fast"):  # no offsets: much less memory and time
            return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def vocab_size(self):
        return self.tok.get_vocab_size()

    def save(self, path):
        self.tok.save(path)


def write_tokenizer_files(tok, d, max_positions):
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": EOT, "eos_token": EOT,
                   "pad_token": EOT, "unk_token": None, "model_max_length": max_positions,
                   "clean_up_tokenization_spaces": False, "tokenizer_class": "PreTrainedTokenizerFast"}, f,
                  indent=1)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}, f, indent=1)


# ---------------------------------------------------------------------------------------------------------
# Perplexity windows (identical to `tandem perplexity`; see src/eval/perplexity.h)


def perplexity_windows(n_tokens, ctx, stride):
    """[(start, first_scored, end)]: the window is tokens[start:end]; the targets tokens[first_scored:end] are
    scored (each predicted from the logits of the token before it).

    stride == 0 (default): non-overlapping windows of ctx tokens, floor(n/ctx) of them; the first half of each
    window is context only, the targets are positions ctx/2 + 1 .. ctx - 1 of the window (as llama-perplexity).
    stride > 0: windows of ctx tokens starting every `stride` tokens (the last one may be shorter and ends at
    the last token); the first window scores all its targets 1 .. end-1, every later one only the targets not
    scored before (its last `stride` tokens, or fewer for the last one).
    """
    out = []
    if stride == 0:
        first = ctx // 2
        for k in range(n_tokens // ctx):
            out.append((k * ctx, k * ctx + first + 1, (k + 1) * ctx))
        return out
    scored_to = 1
    start = 0
    while True:
        end = min(start + ctx, n_tokens)
        if end > scored_to:
            out.append((start, max(scored_to, start + 1), end))
            scored_to = end
        if end == n_tokens:
            return out
        start += stride


@torch.no_grad()
def perplexity(forward, tokens, ctx, stride, bos_id, device, batch=8):
    """PPL and its standard error over the windows above. With bos_id set, the first token of every window is
    replaced by BOS (as llama-perplexity does for models that add BOS)."""
    nll_sum, nll2_sum, count = 0.0, 0.0, 0
    windows = perplexity_windows(len(tokens), ctx, stride)
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        for start, first, end in group:  # ragged windows happen only in stride mode; keep it simple
            ids = list(tokens[start:end])
            if bos_id is not None:
                ids[0] = bos_id
            x = torch.tensor([ids], dtype=torch.long, device=device)
            logits = forward(x).float()[0]
            lp = torch.log_softmax(logits[first - start - 1:end - start - 1], dim=-1)
            tgt = x[0, first - start:end - start]
            nll = -lp.gather(1, tgt[:, None])[:, 0].double()
            nll_sum += nll.sum().item()
            nll2_sum += (nll * nll).sum().item()
            count += nll.numel()
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    se = math.sqrt(max(var, 0.0) / (count - 1)) if count > 1 else 0.0
    return {"ppl": math.exp(mean), "ppl_err": math.exp(mean) * se, "mean_nll": mean, "tokens_scored": count,
            "windows": len(windows), "ctx": ctx, "stride": stride}


# ---------------------------------------------------------------------------------------------------------
# Models


def make_config(shape, vocab, max_positions):
    return qwen3_small.qwen3_config(vocab, shape["hidden"], shape["layers"], shape["heads"], shape["kv_heads"],
                                    shape["head_dim"], shape["intermediate"], max_positions, 0, 0)


def build_model(cfg, use_hf):
    if use_hf:
        hf_cfg = transformers.Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures",
                                                                                        "model_type",
                                                                                        "torch_dtype")})
        torch.manual_seed(0)
        model = transformers.Qwen3ForCausalLM(hf_cfg)
        return model, (lambda m, x: m(input_ids=x, use_cache=False).logits)
    torch.manual_seed(0)
    return qwen3_small.Qwen3Small(cfg), (lambda m, x: m(x))


def n_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def parity_check(cfg, device, log):
    """transformers' Qwen3ForCausalLM and qwen3_small.Qwen3Small on the same random weights."""
    hf, hf_fwd = build_model(cfg, True)
    own, own_fwd = build_model(cfg, False)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.05)
    own.load_state_dict(hf.state_dict())
    hf.to(device).float().eval()
    own.to(device).float().eval()
    x = torch.randint(0, cfg["vocab_size"], (2, 64), device=device)
    with torch.no_grad():
        a, b = hf_fwd(hf, x).float(), own_fwd(own, x).float()
    rel = ((a - b).abs().max() / a.abs().max()).item()
    log("parity transformers vs qwen3_small (fp32, random weights): max |diff| / max |logit| = %.2e" % rel)
    return rel


def decay_groups(model):
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def lr_factor(progress, warmup=0.03, floor=0.1):
    if progress < warmup:
        return progress / warmup
    q = min(1.0, (progress - warmup) / (1.0 - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * q))


# ---------------------------------------------------------------------------------------------------------
# Training


def train(runs, stream, val_stream, seq, batch, budget_s, token_cap, device, log, eval_every_s, log_every_s):
    """runs: list of dicts {name, model, fwd, lr}. Trains all of them on the same batches until budget_s seconds
    or token_cap tokens, whichever comes first; the learning-rate schedule follows the same progress measure."""
    use_amp = device.type == "cuda"
    for r in runs:
        kw = {"fused": True} if use_amp else {}
        r["opt"] = torch.optim.AdamW(decay_groups(r["model"]), lr=r["lr"], betas=(0.9, 0.95), eps=1e-8, **kw)
        r["best"] = (float("inf"), None, 0)
        r["curve"] = []
        r["model"].train()
    n = stream.numel() - seq - 1
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    ar = torch.arange(seq + 1, device=device)
    # A fixed held-out batch to watch over-fitting (pages not in heldout_eval.txt).
    vgen = torch.Generator(device=device)
    vgen.manual_seed(99)
    n_val = min(64, max(1, (val_stream.numel() - seq - 1) // seq))
    voffs = torch.randint(0, val_stream.numel() - seq - 1, (n_val,), generator=vgen, device=device)
    vchunk = val_stream[voffs[:, None] + ar].long()

    def val_loss(r):
        r["model"].eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            losses = []
            for i in range(0, n_val, 16):
                c = vchunk[i:i + 16]
                logits = r["fwd"](r["model"], c[:, :-1])
                losses.append(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), c[:, 1:].reshape(-1),
                                              reduction="sum").item())
        r["model"].train()
        return sum(losses) / (n_val * seq)

    t_start = time.time()
    next_log, next_eval = t_start + log_every_s, t_start + eval_every_s
    step, tokens = 0, 0
    while True:
        now = time.time()
        elapsed = now - t_start
        progress = max(elapsed / budget_s, tokens / token_cap)
        final = progress >= 1.0
        if now >= next_eval or final:
            for r in runs:
                vl = val_loss(r)
                r["curve"].append({"step": step, "tokens": tokens, "val_loss": vl, "time": round(elapsed, 1)})
                tag = ""
                if vl < r["best"][0]:
                    r["best"] = (vl, {k: v.detach().clone() for k, v in r["model"].state_dict().items()}, step)
                    tag = " (best)"
                log("  eval %-5s step %6d tokens %11d val_loss %.4f%s" % (r["name"], step, tokens, vl, tag))
            next_eval = time.time() + eval_every_s
        if final:
            break
        f = lr_factor(progress)
        offs = torch.randint(0, n, (batch,), generator=gen, device=device)
        chunk = stream[offs[:, None] + ar].long()
        x, y = chunk[:, :-1], chunk[:, 1:]
        for r in runs:
            for g in r["opt"].param_groups:
                g["lr"] = r["lr"] * f
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = r["fwd"](r["model"], x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(r["model"].parameters(), 1.0)
            r["opt"].step()
            r["opt"].zero_grad(set_to_none=True)
            r["last_loss"] = loss
        step += 1
        tokens += batch * seq
        if device.type == "cuda" and step % 4 == 0:
            torch.cuda.synchronize()
        if time.time() >= next_log:
            el = time.time() - t_start
            msg = "  step %6d  %5.1f%%  lr x%.3f  %.0f tok/s" % (step, 100 * progress, f, tokens / el)
            for r in runs:
                lv = r["last_loss"].item()
                r["curve"].append({"step": step, "tokens": tokens, "train_loss": lv, "time": round(el, 1)})
                msg += "  %s %.4f" % (r["name"], lv)
            log(msg)
            next_log = time.time() + log_every_s
    for r in runs:
        best_loss, best_state, best_step = r["best"]
        r["model"].load_state_dict(best_state)
        r["best_step"], r["best_val_loss"] = best_step, best_loss
        log("%s: %d steps, %d tokens (%.2f epochs); keeping step %d (val_loss %.4f)" %
            (r["name"], step, tokens, tokens / stream.numel(), best_step, best_loss))
    return step, tokens


# ---------------------------------------------------------------------------------------------------------


def read_pages(path, limit_bytes=None):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        text = f.read(limit_bytes) if limit_bytes else f.read()
    pages = text.split(RECORD_SEP)
    if limit_bytes:
        pages = pages[:-1] or pages
    return pages


@torch.no_grad()
def greedy(forward, model, ids, n, device):
    ids = list(ids)
    out = []
    for _ in range(n):
        x = torch.tensor([ids], dtype=torch.long, device=device)
        nxt = int(forward(model, x).float()[0, -1].argmax())
        ids.append(nxt)
        out.append(nxt)
    return out


def main():
    t_script = time.time()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--corpus", default=os.path.join(here, "corpus"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--deadline-s", type=float, default=420,
                    help="seconds from start by which everything must be written; training gets what is left")
    ap.add_argument("--max-train-s", type=float, default=300)
    ap.add_argument("--max-epochs", type=float, default=6.0, help="training stops after this many passes")
    ap.add_argument("--reserve-s", type=float, default=75, help="time kept for evaluation and saving")
    ap.add_argument("--eval-ctx", type=int, default=512)
    ap.add_argument("--tokenizer-sample", type=float, default=0.4, help="fraction of pages the BPE is trained on")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the whole recipe")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train_log.txt"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_hf = transformers is not None and not args.smoke
    log("torch %s, transformers %s, tokenizers %s, device %s%s" %
        (torch.__version__, getattr(transformers, "__version__", "-"), getattr(tokenizers, "__version__", "-"),
         device, (" (" + torch.cuda.get_device_name(0) + ")") if device.type == "cuda" else ""))
    if args.smoke:
        main_shape, draft_shape = SMOKE_MAIN, SMOKE_DRAFT
        args.seq, args.batch = min(args.seq, 64), min(args.batch, 8)
        args.eval_ctx = min(args.eval_ctx, 64)
    else:
        main_shape, draft_shape = MAIN, DRAFT
    max_positions = args.seq
    torch.backends.cuda.matmul.allow_tf32 = True

    # 1. corpus
    limit = 3_000_000 if args.smoke else None
    pages = read_pages(os.path.join(args.corpus, "train.txt.xz"), limit)
    held_pages = read_pages(os.path.join(args.corpus, "heldout.txt.xz"))
    with open(os.path.join(args.corpus, "heldout_eval.txt"), encoding="utf-8") as f:
        eval_text = f.read()
    if args.smoke:
        eval_text = eval_text[:6000]
    eval_chunks = set(eval_text.split("\n\n"))
    val_pages = [p for p in held_pages if p.split("\n\n")[0] not in eval_chunks]
    log("corpus: %d train pages (%d chars), %d held-out pages for validation, eval text %d chars" %
        (len(pages), sum(map(len, pages)), len(val_pages), len(eval_text)))

    # 2. tokenizer
    if tokenizers is not None and not args.smoke:
        step = max(1, round(1 / args.tokenizer_sample))
        tok = HfTokenizer.train(pages[::step], args.vocab, log)
    else:
        tok = ByteTokenizer()
        log("tokenizer: byte-only stand-in (%d tokens)" % tok.vocab_size())
    vocab = tok.vocab_size()

    # 3. tokens
    t = time.time()
    enc = tok.encode_batch if hasattr(tok, "encode_batch") else (lambda ts: [tok.encode(x) for x in ts])

    def to_stream(ps):
        ids = []
        for chunk in enc(ps):
            ids.append(0)
            ids.extend(chunk)
        return torch.tensor(ids, dtype=torch.int32)

    stream = to_stream(pages).to(device)
    val_stream = to_stream(val_pages).to(device)
    eval_ids = [0] + tok.encode(eval_text)  # BOS first, as tandem tokenizes (add_bos_token = true)
    log("tokens: train %d (%.2f chars/token), validation %d, eval %d, in %.1fs" %
        (stream.numel(), sum(map(len, pages)) / stream.numel(), val_stream.numel(), len(eval_ids),
         time.time() - t))

    # 4. models
    main_cfg = make_config(main_shape, vocab, max_positions)
    draft_cfg = make_config(draft_shape, vocab, max_positions)
    results = {"main_config": main_cfg, "draft_config": draft_cfg, "eval_ctx": args.eval_ctx}
    if use_hf:
        try:
            results["parity_rel_err"] = parity_check(main_cfg, device, log)
        except Exception as e:  # a cross-check only: never lose the run to it
            log("parity check failed: %r" % (e,))
    runs = []
    for name, cfg, lr in (("main", main_cfg, args.lr), ("draft", draft_cfg, args.draft_lr)):
        model, fwd = build_model(cfg, use_hf)
        model.to(device)
        log("%s: %s, %d parameters" % (name, {k: cfg[k] for k in ("hidden_size", "num_hidden_layers",
                                                                   "num_attention_heads", "num_key_value_heads",
                                                                   "head_dim", "intermediate_size")},
                                         n_params(model)))
        runs.append({"name": name, "model": model, "fwd": fwd, "lr": lr, "cfg": cfg})

    budget = min(args.max_train_s, args.deadline_s - (time.time() - t_script) - args.reserve_s)
    if args.smoke:
        budget = min(budget, 25)
    log("training for %.0fs or %.1f epochs (batch %d x %d tokens)" % (budget, args.max_epochs, args.batch, args.seq))
    steps, tokens = train(runs, stream, val_stream, args.seq, args.batch, budget,
                          args.max_epochs * stream.numel(), device, log,
                          eval_every_s=max(5.0, budget / 12), log_every_s=max(2.0, budget / 40))
    results.update({"train_steps": steps, "train_tokens": tokens, "train_stream_tokens": stream.numel(),
                    "train_seconds": budget})

    # 5-6. bf16 checkpoint, fp32 evaluation, save
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results["eval_ids"] = eval_ids
    for r in runs:
        model, name = r["model"], r["name"]
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        state = {k: v.detach().to(torch.bfloat16).float() for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        model.float().eval()
        if use_hf:
            model.to(torch.bfloat16).save_pretrained(d)  # safetensors
            model.float()
        else:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(r["cfg"], f, indent=1)
            qwen3_small.save_safetensors(qwen3_small.export_state(model), os.path.join(d, "model.safetensors"))
        write_tokenizer_files(tok, d, max_positions)
        fwd = r["fwd"]
        if use_hf:  # the reference figure comes from the saved directory, loaded back by transformers
            try:
                model = transformers.Qwen3ForCausalLM.from_pretrained(d, dtype=torch.float32)
            except TypeError:
                model = transformers.Qwen3ForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
            model.to(device).eval()
        ppl = perplexity(lambda x: fwd(model, x), eval_ids, args.eval_ctx, 0, 0, device)
        log("%s: PyTorch fp32 perplexity of heldout_eval.txt (ctx %d, bf16 weights): %.4f +/- %.4f over %d tokens"
            % (name, args.eval_ctx, ppl["ppl"], ppl["ppl_err"], ppl["tokens_scored"]))
        gens = []
        for p in PROMPTS:
            ids = [0] + tok.encode(p)
            out = greedy(fwd, model, ids, 32, device)
            gens.append({"prompt": p, "prompt_ids": ids, "greedy_ids": out, "text": tok.decode(out)})
            log("  %s| %r" % (p, tok.decode(out)))
        results[name] = {"ppl": ppl, "greedy": gens, "best_step": r["best_step"], "best_val_loss":
                         r["best_val_loss"], "curve": r["curve"], "params": n_params(model)}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f)
    log("done in %.0fs" % (time.time() - t_script))


if __name__ == "__main__":
    main()
