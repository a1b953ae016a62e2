"""A deterministic corpus of mixed text for tokenizer parity tests (used by tokenizer_parity.py).

Lines never contain "\\n" (every other character may appear, "\\r", U+0085 and U+2028 included), so a file of
lines joined with "\\n" gives the same lines back. Sources: English prose from Python's own documentation
(pydoc_data) and docstrings, code from the standard library, and synthesized numbers, whitespace, emoji, CJK,
Arabic, combining marks, unusual code points, control characters, mojibake and chat markup.
"""

import ast
import os
import random
import sysconfig

SPECIAL_MARKUP = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]


def _prose(rng, budget):
    """English prose: Python's documentation topics, then module docstrings, as lines."""
    lines = []
    try:
        import pydoc_data.topics as topics

        for key in sorted(topics.topics):
            for line in topics.topics[key].split("\n"):
                if line.strip():
                    lines.append(line)
    except ImportError:
        pass
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in sorted(os.listdir(stdlib)):
        if sum(len(x) for x in lines) > budget:
            break
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    lines.extend(l for l in doc.split("\n") if l.strip())
    out, size = [], 0
    for line in lines:
        if size > budget:
            break
        out.append(line)
        size += len(line.encode("utf-8"))
    return out


def _code(rng, budget):
    """Source lines of standard library modules, indentation and all."""
    stdlib = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(stdlib) if n.endswith(".py"))
    rng.shuffle(names)
    out, size = [], 0
    for name in names:
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.split("\n")[:400]:
            out.append(line.replace("\r", ""))
            size += len(line.encode("utf-8")) + 1
        if size > budget:
            break
    return out


def _numbers(rng, n):
    out = []
    for _ in range(n):
        kind = rng.randrange(10)
        if kind == 0:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 30))))
        elif kind == 1:
            out.append(f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 9)}f}")
        elif kind == 2:
            out.append(f"{rng.randrange(1, 10**9):,}")
        elif kind == 3:
            out.append(f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T"
                       f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z")
        elif kind == 4:
            out.append(f"+1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}")
        elif kind == 5:
            out.append(hex(rng.getrandbits(64)) + " " + oct(rng.getrandbits(20)) + " " + bin(rng.getrandbits(12)))
        elif kind == 6:
            out.append(f"{rng.random():e} {rng.randrange(10)}.{rng.randrange(10)}.{rng.randrange(100)} v{rng.randrange(9)}")
        elif kind == 7:
            out.append("".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 200))))
        elif kind == 8:
            out.append(" ".join(str(rng.randrange(-1000, 1000)) for _ in range(rng.randrange(1, 30))))
        else:
            # Digits of other scripts: Arabic-Indic, Devanagari, fullwidth, superscripts, fractions, Roman numerals.
            digits = "٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９²³¹½¼¾ⅫⅣ①②"
            out.append("".join(rng.choice(digits + " .,") for _ in range(rng.randrange(1, 40))))
    return out


def _whitespace(rng, n):
    pieces = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\r", "\r ", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
              "\u1680", "\u2000", "\u2009", "\u200a", "\u202f", "\u205f", "\u180e", "\u200b", "\x0b", "\x0c",
              "\x1c", "\x1d", "\x1e", "\x1f"]
    words = ["word", "x", "Hello", "42", "end.", "'s", "don't", "(", ")", "-"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 14)):
            parts.append(rng.choice(pieces) * rng.randrange(1, 6))
            if rng.random() < 0.6:
                parts.append(rng.choice(words))
        out.append("".join(parts))
    out += ["", " ", "  ", "\t", " " * 100, "a" + " " * 50 + "b", "trailing   ", "   leading", "\r\r\r"]
    return out


EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✨", "🚀", "🧪",
         "🫠", "🐍", "⌚", "☕", "1️⃣", "#️⃣", "©️", "🙂", "🤖", "💩"]
CJK = ["机器学习是人工智能的一个分支。", "今日はいい天気ですね。", "東京タワーに行きました！", "안녕하세요, 만나서 반갑습니다.",
       "我们需要更多的测试数据：一、二、三。", "カタカナとひらがなとか漢字", "《红楼梦》是中国古典小说。", "한국어 텍스트와 숫자 123",
       "「こんにちは」と言った。", "数据库（Database）的设计"]
ARABIC = ["مرحبا بالعالم", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ", "هذا نص تجريبي ١٢٣ للاختبار.", "السَّلامُ عَلَيْكُم",
          "كتاب، قلم؛ ورقة؟", "English and عربي mixed 42"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Z\u0351\u0334\u0358\u0322", "क्षत्रिय", "स्वागत है",
             "ภาษาไทย", "ខ្មែរ", "ḍ̇", "q\u0307\u0323", "\u0301", "Å", "Å", "ﬁ", "ǅ", "ŉ", "İstanbul", "ıi",
             "ΣΊΣΥΦΟΣ σοφός", "Привет, мир", "Ελληνικά"]
UNUSUAL = ["\ufffd", "\ufeff", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\ue000", "\uf8ff",
           "\U000f0000", "\U0010fffd", "\ufdd0", "\ufffe", "\uffff", "\U0001d400\U0001d401", "\U00010400",
           "\U0001d11e", "\u00ad", "\u034f", "\u2063", "ſ", "'ſ", "'K", "'ſ'S", "\u212a", "\U0001f1e6",
           "\U000e0041", "\u0600", "\u061c", "\u2066x\u2069", "\u202ex\u202c", "\u3164", "\U00020000", "\U0002a6d6"]
CONTROLS = [chr(c) for c in list(range(0, 10)) + list(range(11, 32)) + [127] + list(range(0x80, 0xA0))]
ENGLISH_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "It's", "we'll", "THEY'RE", "I'm",
                 "don't", "can't", "U.S.A.", "e-mail", "co-operate", "naïve", "café", "résumé", "über"]


def _mojibake(rng, s):
    """Text that looks like broken encodings: UTF-8 read as Latin-1 / CP1252, escaped bytes, replacement chars."""
    kind = rng.randrange(4)
    if kind == 0:
        return s.encode("utf-8").decode("latin-1")
    if kind == 1:
        return s.encode("utf-8").decode("cp1252", errors="replace")
    if kind == 2:
        return "".join(f"\\x{b:02x}" for b in s.encode("utf-8"))
    return s.encode("utf-8").decode("ascii", errors="replace")


def _mixed(rng, n, pools):
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 12)):
            pool = rng.choice(pools)
            parts.append(rng.choice(pool))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "  ", "\t", ", ", ". ", "\u00a0"]))
        out.append("".join(parts))
    return out


def _random_code_points(rng, n):
    """Random characters from assigned, long-standing blocks (so Unicode version differences do not matter)."""
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x5D0, 0x5EA), (0x621, 0x64A),
              (0x900, 0x97F), (0xE01, 0xE3A), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20BF), (0x2190, 0x21FF),
              (0x2200, 0x22FF), (0x2500, 0x257F), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FA5),
              (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x1F600, 0x1F64F), (0x1F300, 0x1F5FF)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randrange(1, 60)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randrange(lo, hi + 1)))
        out.append("".join(chars))
    return out


def _special(rng, n):
    out = ["<|im_start|>user Hello!<|im_end|>", "<|endoftext|>", "a<|endoftext|>b", "<|im_start|><|im_end|>",
           "<|im_start", "|im_end|>", "<<|im_start|>>", "text <tool_call>{\"name\": \"f\"}</tool_call> more",
           "<tool_call><tool_call>", " <|im_end|> ", "<|im_start|>assistant\tSure — here it is.<|im_end|>"]
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 8)):
            parts.append(rng.choice(SPECIAL_MARKUP) if rng.random() < 0.4 else rng.choice(ENGLISH_WORDS + EMOJI + CJK))
            parts.append(rng.choice(["", " ", "\t"]))
        out.append("".join(parts))
    return out


def _long_lines(rng):
    return ["a" * 5000, "ab" * 3000, "1234567890" * 500, " " * 3000 + "x", "😀" * 1000, "的" * 2000,
            " ".join(rng.choice(ENGLISH_WORDS) for _ in range(3000)),
            "".join(rng.choice("abc ") for _ in range(20000))]


def make_corpus(seed=1234, scale=1.0):
    """Returns (lines, makeup) where makeup maps category -> (lines, bytes)."""
    rng = random.Random(seed)
    cats = {}
    cats["prose (Python docs, docstrings)"] = _prose(rng, int(900_000 * scale))
    cats["code (Python stdlib)"] = _code(rng, int(700_000 * scale))
    cats["numbers"] = _numbers(rng, int(4000 * scale))
    cats["whitespace runs"] = _whitespace(rng, int(2000 * scale))
    cats["emoji"] = _mixed(rng, int(1500 * scale), [EMOJI, ENGLISH_WORDS])
    cats["CJK"] = _mixed(rng, int(1500 * scale), [CJK, ENGLISH_WORDS, ["。", "、", "！"]])
    cats["Arabic"] = _mixed(rng, int(1000 * scale), [ARABIC, ENGLISH_WORDS])
    cats["combining marks / scripts"] = _mixed(rng, int(1500 * scale), [COMBINING, ENGLISH_WORDS])
    cats["unusual code points"] = _mixed(rng, int(1500 * scale), [UNUSUAL, ENGLISH_WORDS, EMOJI])
    cats["control characters"] = _mixed(rng, int(1000 * scale), [CONTROLS, ENGLISH_WORDS])
    src = ENGLISH_WORDS + CJK + ARABIC + EMOJI + COMBINING
    cats["mojibake / escaped bytes"] = [_mojibake(rng, " ".join(rng.choice(src) for _ in range(rng.randrange(1, 8))))
                                        for _ in range(int(1500 * scale))]
    cats["random code points"] = _random_code_points(rng, int(3000 * scale))
    cats["everything mixed"] = _mixed(rng, int(4000 * scale),
                                      [EMOJI, CJK, ARABIC, COMBINING, UNUSUAL, CONTROLS, ENGLISH_WORDS,
                                       [str(rng.randrange(10**6)) for _ in range(50)], [" " * 4, "\t", "\r"]])
    cats["chat markup / special tokens"] = _special(rng, int(1000 * scale))
    cats["long lines"] = _long_lines(rng)
    lines, makeup = [], {}
    for name, ls in cats.items():
        ls = [l.replace("\n", " ") for l in ls]
        makeup[name] = (len(ls), sum(len(l.encode("utf-8")) + 1 for l in ls))
        lines.extend((name, l) for l in ls)
    return lines, makeup


if __name__ == "__main__":
    lines, makeup = make_corpus()
    total = sum(b for _, b in makeup.values())
    for name, (n, b) in makeup.items():
        print(f"{name:34s} {n:7d} lines {b:9d} bytes")
    print(f"{'total':34s} {len(lines):7d} lines {total:9d} bytes")
