#!/usr/bin/env python3
"""Builds the training corpus of tandem's small models from English text that Debian packages install.

Python 3 standard library only. Reads the installed files of the packages listed in PACKAGES (install them with
`apt-get install -y <names>` first), turns each into plain text (HTML, POD and dictd markup stripped), normalizes
it, drops repeated paragraphs, cuts every page into chunks of whole paragraphs and assigns each chunk to the
training or the held-out split by a hash of its text (deterministic: the same packages give the same corpus).

Writes into --out (default: models/training/corpus, which git ignores):
  train.txt.xz     training text; pages are separated by a line holding only the ASCII record separator (0x1E)
  heldout.txt.xz   all held-out chunks, same layout
  heldout_eval.txt a ~100 kB plain-text sample of the held-out split (the perplexity figures use this file)
  stats.json       bytes per source and split

Usage: python3 models/training/make_corpus.py [--out DIR] [--eval-bytes N]
"""

import argparse
import glob
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import re
import sys
import unicodedata

# Debian packages (bookworm) read by this script. Licences: see models/README.md.
PACKAGES = [
    "python3.11-doc", "perl-doc", "debian-handbook", "debian-reference-en", "debian-faq", "gnu-standards",
    "jargon-text", "dict-gcide", "dict-devil", "fortunes", "fortunes-min", "postgresql-doc-15", "python-django-doc",
    "sqlite3-doc", "git-doc", "linux-doc-6.1"
]

RECORD_SEP = "\x1e"  # separates pages in train.txt / heldout.txt
HELDOUT_PER_MILLE = 15  # 1.5% of the chunks are held out
CHUNK_CHARS = 4000  # a page is cut into chunks of whole paragraphs of about this many characters
MIN_DEDUP_PARAGRAPH = 60  # paragraphs at least this long are kept once only (licence boilerplate, headers)

# ---------------------------------------------------------------------------------------------------------
# Normalization


def normalize(text: str) -> str:
    """NFC, Unix newlines, no control characters except newline, tabs as spaces, no trailing blanks."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c)[0] != "C")
    text = text.replace("\u00a0", " ").replace("\u00b6", "")  # no-break space; pilcrow of Sphinx header links
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def looks_like_prose(lines):
    """A block of hard-wrapped running text (not code, not a table, not a list of short lines)."""
    if len(lines) < 2:
        return False
    if any(line.startswith(" ") for line in lines[1:]):
        return False
    longest = max(len(line) for line in lines)
    if longest < 50:
        return False
    return all(len(line) >= 0.55 * longest for line in lines[:-1])


def unwrap_prose(text: str) -> str:
    """Joins the lines of hard-wrapped prose paragraphs; leaves code, poems and tables alone."""
    out = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        common = min((len(l) - len(l.lstrip(" ")) for l in lines if l.strip()), default=0)
        lines = [l[common:] for l in lines]
        block = "\n".join(lines)
        if looks_like_prose(lines):
            block = " ".join(line.strip() for line in lines)
        out.append(block)
    return "\n\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# HTML to text


class HtmlToText(html.parser.HTMLParser):
    """Text of an HTML page: block elements become paragraphs, <pre> keeps its layout, navigation is skipped."""

    BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "table", "section",
             "blockquote", "ul", "ol", "dl", "pre", "br", "hr", "figure", "caption", "article", "main"}
    VOID = {"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr", "source", "embed"}
    SKIP_TAGS = {"script", "style", "head", "nav", "title", "noscript", "svg"}
    SKIP_CLASSES = {"docnav", "toc", "headerlink", "sphinxsidebar", "related", "footer", "navheader", "navfooter",
                    "linenos", "legalnotice", "copyright", "highlight-none", "mobile-nav", "navigation", "nosearch",
                    "menu", "searchbox", "doc-nav"}
    SKIP_IDS = {"banner", "title", "site-copyright", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # (tag, skipping) for open non-void elements
        self.skip_depth = 0
        self.pre_depth = 0
        self.parts = []

    def _skips(self, tag, attrs):
        if tag in self.SKIP_TAGS:
            return True
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        return bool(classes & self.SKIP_CLASSES) or (a.get("id") in self.SKIP_IDS)

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCK and not self.skip_depth:
            self.parts.append("\n\n" if tag != "br" else "\n")
        if tag in self.VOID:
            return
        skipping = self._skips(tag, attrs)
        self.stack.append((tag, skipping))
        if skipping:
            self.skip_depth += 1
        if tag == "pre":
            self.pre_depth += 1

    def handle_startendtag(self, tag, attrs):
        if tag in self.BLOCK and not self.skip_depth:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:
            t, skipping = self.stack.pop()
            if skipping:
                self.skip_depth -= 1
            if t == "pre":
                self.pre_depth -= 1
            if t == tag:
                break
        if tag in self.BLOCK and not self.skip_depth:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip_depth:
            return
        if self.pre_depth:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self):
        raw = "".join(self.parts)
        # Trim the spaces that inline collapsing leaves at the edges of lines (outside <pre> this is harmless;
        # inside, leading indentation is kept because only trailing blanks and lone-space lines are touched).
        raw = re.sub(r"[ ]+\n", "\n", raw)
        raw = re.sub(r"\n[ ](?=\S)", "\n", raw)
        return raw


def html_to_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        parser = HtmlToText()
        parser.feed(f.read())
        parser.close()
    return parser.text()


# ---------------------------------------------------------------------------------------------------------
# POD to text

POD_CODE = re.compile(r"([BCEFILSXZ])<([^<>]*)>")
POD_CODE_MULTI = re.compile(r"([BCEFILSXZ])<<+\s+(.*?)\s+>>+", re.S)
POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}


def _pod_code(m):
    code, body = m.group(1), m.group(2)
    if code in "XZ":
        return ""
    if code == "E":
        if body.isdigit():
            return chr(int(body))
        if body.startswith("0x"):
            return chr(int(body, 16))
        return POD_ESCAPES.get(body, html.unescape("&%s;" % body))
    if code == "L":
        if "|" in body:
            return body.split("|", 1)[0]
        return body.replace('"', "").split("/")[0] or body
    return body


def pod_to_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        src = f.read()
    out = []
    in_pod = True  # .pod files start in POD mode
    skipping_block = False
    for para in re.split(r"\n\s*\n", src):
        if para.startswith("="):
            cmd, _, rest = para[1:].partition(" ")
            cmd = cmd.strip().split("\n")[0]
            if cmd == "cut":
                in_pod = False
            elif cmd in ("pod",):
                in_pod = True
            elif cmd == "begin":
                skipping_block = True
            elif cmd == "end":
                skipping_block = False
            elif cmd.startswith("head") or cmd == "item":
                in_pod = True
                rest = rest.strip()
                if rest and rest != "*":
                    out.append(rest)
            continue
        if not in_pod or skipping_block:
            continue
        out.append(para)
    text = "\n\n".join(out)
    for _ in range(4):  # nested formatting codes, innermost first
        text = POD_CODE_MULTI.sub(_pod_code, text)
        text = POD_CODE.sub(_pod_code, text)
    return text


# ---------------------------------------------------------------------------------------------------------
# dictd dictionaries (GCIDE, The Devil's Dictionary)

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s):
    n = 0
    for c in s:
        n = n * 64 + B64.index(c)
    return n


def dictd_entries(index_path, dict_path):
    """(headword, entry text) for each distinct entry of a dictd database, in file order."""
    with gzip.open(dict_path, "rb") as f:
        data = f.read()
    spans = {}
    with open(index_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3 or fields[0].startswith("00"):
                continue
            span = (_b64num(fields[1]), _b64num(fields[2]))
            spans.setdefault(span, fields[0])
    for (off, length), head in sorted(spans.items()):
        yield head, data[off:off + length].decode("utf-8", errors="replace")


GCIDE_SOURCE_TAG = re.compile(r"^\s*\[[^\]\n]{1,40}\]\s*$", re.M)  # "[1913 Webster]", "[WordNet 1.5]", "[PJC]"
GCIDE_INLINE_TAG = re.compile(r"\s*\[(?:1913 Webster|Webster 1913 Suppl\.|WordNet 1\.5|PJC|Century Dict\.|RN|Chambers 1728|"
                              r"Webster 1913|Webster|Century|Ruskin)\]")
GCIDE_PRON = re.compile(r"\\[^\\\n]{1,80}\\,?")
GCIDE_BRACES = re.compile(r"\{([^{}\n]*)\}")


def clean_gcide(entry):
    text = GCIDE_SOURCE_TAG.sub("", entry)
    text = GCIDE_INLINE_TAG.sub("", text)
    text = GCIDE_PRON.sub("", text)
    text = GCIDE_BRACES.sub(r"\1", text)
    text = re.sub(r"[ ]+,", ",", text)
    blocks = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if lines:
            blocks.append(re.sub(r"[ ]{2,}", " ", " ".join(lines)))
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------------------
# Sources: each yields (page_id, raw text)


def src_python_docs():
    root = "/usr/share/doc/python3.11/html"
    for path in sorted(glob.glob(root + "/**/*.html", recursive=True)):
        rel = os.path.relpath(path, root)
        if rel.startswith(("_static", "genindex", "py-modindex", "search", "_sources")):
            continue
        yield "python/" + rel, html_to_text(path)


def src_perl_docs():
    for path in sorted(glob.glob("/usr/share/perl/5.*/pod/*.pod")):
        name = os.path.basename(path)
        if re.match(r"perl5\d+delta|perl\d+delta|perltoc|perlmodlib", name):  # change logs and long indexes
            continue
        yield "perl/" + name, pod_to_text(path)


def src_debian_handbook():
    for path in sorted(glob.glob("/usr/share/doc/debian-handbook/html/en-US/*.html")):
        if os.path.basename(path) in ("index.html", "ix01.html"):
            continue
        yield "handbook/" + os.path.basename(path), html_to_text(path)


def src_html_tree(prefix, root, skip_dirs=()):
    for path in sorted(glob.glob(root + "/**/*.html", recursive=True)):
        rel = os.path.relpath(path, root)
        base = os.path.basename(rel)
        if rel.split("/")[0] in skip_dirs or base in ("genindex.html", "search.html", "py-modindex.html"):
            continue
        yield prefix + rel, html_to_text(path)


def src_postgresql_docs():
    yield from src_html_tree("postgresql/", "/usr/share/doc/postgresql-doc-15/html", ("release",))


def src_django_docs():
    yield from src_html_tree("django/", "/usr/share/doc/python-django-doc/html",
                             ("_modules", "_sources", "_static", "releases"))


def src_sqlite_docs():
    yield from src_html_tree("sqlite/", "/usr/share/doc/sqlite3", ("images",))


def src_git_docs():
    yield from src_html_tree("git/", "/usr/share/doc/git-doc", ("RelNotes", "howto-index"))


def src_linux_docs():
    yield from src_html_tree("linux/", "/usr/share/doc/linux-doc-6.1/html",
                             ("translations", "_static", "_sources", "_images", "output"))


def src_gzip_text(page_id, path):
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        yield page_id, unwrap_prose(f.read())


def src_debian_reference():
    yield from src_gzip_text("debian-reference", "/usr/share/debian-reference/debian-reference.en.txt.gz")


def src_debian_faq():
    yield from src_gzip_text("debian-faq", "/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz")


def src_gnu_standards():
    for name in ("standards", "maintain"):
        yield from src_gzip_text("gnu-" + name, "/usr/share/doc/gnu-standards/%s.text.gz" % name)


def src_jargon():
    with gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    # The file opens with long lists of entry names (the table of contents); the entries themselves start at
    # the first glossary heading line ":0:" ... keep only what follows the first ":" headword line.
    m = re.search(r"^\s*:[^:\n]+:", text, re.M)
    if m:
        text = text[m.start():]
    yield "jargon", unwrap_prose(GCIDE_BRACES.sub(r"\1", text))


def src_gcide():
    for head, entry in dictd_entries("/usr/share/dictd/gcide.index", "/usr/share/dictd/gcide.dict.dz"):
        yield "gcide/" + head, clean_gcide(entry)


def src_devil():
    for head, entry in dictd_entries("/usr/share/dictd/devil.index", "/usr/share/dictd/devil.dict.dz"):
        yield "devil/" + head, unwrap_prose(entry)


def src_fortunes():
    skip = {"ascii-art", "translate-me"}
    files = sorted(set(glob.glob("/usr/share/games/fortunes/*")))
    for path in files:
        name = os.path.basename(path)
        if "." in name or name in skip or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, item in enumerate(re.split(r"^%$", f.read(), flags=re.M)):
                if item.strip():
                    yield "fortunes/%s/%d" % (name, i), item


SOURCES = [
    ("python-docs", src_python_docs),
    ("perl-docs", src_perl_docs),
    ("postgresql-docs", src_postgresql_docs),
    ("django-docs", src_django_docs),
    ("sqlite-docs", src_sqlite_docs),
    ("git-docs", src_git_docs),
    ("linux-docs", src_linux_docs),
    ("debian-handbook", src_debian_handbook),
    ("debian-reference", src_debian_reference),
    ("debian-faq", src_debian_faq),
    ("gnu-standards", src_gnu_standards),
    ("jargon", src_jargon),
    ("gcide", src_gcide),
    ("devil", src_devil),
    ("fortunes", src_fortunes),
]

# ---------------------------------------------------------------------------------------------------------
# Splitting


def stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha1(s.encode("utf-8")).digest()[:8], "big")


def chunks_of(paragraphs):
    chunk, size = [], 0
    for p in paragraphs:
        if chunk and size + len(p) > CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
        chunk.append(p)
        size += len(p) + 2
    if chunk:
        yield chunk


def build(out_dir, eval_bytes):
    os.makedirs(out_dir, exist_ok=True)
    seen_paragraphs = set()
    seen_pages = set()
    train_pages, heldout_chunks = [], []  # heldout_chunks: (source, hash, text)
    stats = {}
    for source, fn in SOURCES:
        st = stats.setdefault(source, {"pages": 0, "train_bytes": 0, "heldout_bytes": 0, "dropped_dup": 0})
        for page_id, raw in fn():
            text = normalize(raw)
            if len(text) < 20:
                continue
            h = hashlib.sha1(text.encode("utf-8")).digest()
            if h in seen_pages:
                st["dropped_dup"] += 1
                continue
            seen_pages.add(h)
            paragraphs = []
            for p in text.split("\n\n"):
                if not p.strip():
                    continue
                if len(p) >= MIN_DEDUP_PARAGRAPH:
                    ph = hashlib.sha1(p.encode("utf-8")).digest()
                    if ph in seen_paragraphs:
                        st["dropped_dup"] += 1
                        continue
                    seen_paragraphs.add(ph)
                paragraphs.append(p)
            if not paragraphs:
                continue
            st["pages"] += 1
            train_part = []
            for chunk in chunks_of(paragraphs):
                ctext = "\n\n".join(chunk)
                hv = stable_hash(ctext)
                if hv % 1000 < HELDOUT_PER_MILLE:
                    heldout_chunks.append((source, hv, ctext))
                    st["heldout_bytes"] += len(ctext.encode("utf-8"))
                else:
                    train_part.append(ctext)
                    st["train_bytes"] += len(ctext.encode("utf-8"))
            if train_part:
                train_pages.append("\n\n".join(train_part))
        print("%-18s pages %7d  train %10d B  held-out %8d B" %
              (source, st["pages"], st["train_bytes"], st["heldout_bytes"]), file=sys.stderr)

    def write_xz(name, pages):
        data = ("\n" + RECORD_SEP + "\n").join(pages).encode("utf-8")
        with lzma.open(os.path.join(out_dir, name), "wb", preset=9) as f:
            f.write(data)
        return len(data)

    n_train = write_xz("train.txt.xz", train_pages)
    n_held = write_xz("heldout.txt.xz", [c for _, _, c in heldout_chunks])

    # The evaluation sample: from each source, held-out chunks in hash order, up to that source's share of
    # eval_bytes (share = its share of the held-out split), grouped by source.
    total_held = sum(len(c.encode("utf-8")) for _, _, c in heldout_chunks)
    picked = []
    for source, _ in SOURCES:
        mine = sorted([(hv, c) for s, hv, c in heldout_chunks if s == source])
        quota = eval_bytes * sum(len(c.encode("utf-8")) for _, c in mine) / max(total_held, 1)
        used = 0
        for _, c in mine:
            if used >= quota:
                break
            picked.append(c)
            used += len(c.encode("utf-8"))
    with open(os.path.join(out_dir, "heldout_eval.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(picked) + "\n")
    stats["_total"] = {"train_bytes": n_train, "heldout_bytes": n_held, "eval_chunks": len(picked)}
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    print("train %d B, held-out %d B, eval sample %d chunks" % (n_train, n_held, len(picked)), file=sys.stderr)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "corpus"))
    ap.add_argument("--eval-bytes", type=int, default=100_000)
    args = ap.parse_args()
    missing = [p for p in PACKAGES if not os.path.exists("/usr/share/doc/" + p) and
               not os.path.exists("/var/lib/dpkg/info/%s.list" % p)]
    if missing:
        sys.exit("missing Debian packages: %s\ninstall them: apt-get install -y %s" %
                 (" ".join(missing), " ".join(PACKAGES)))
    build(args.out, args.eval_bytes)


if __name__ == "__main__":
    main()
