#!/usr/bin/env python3
"""Instruction counts of CUDA kernels from their PTX, without a GPU (bench/BENCHMARKS.md, seventh session).

For each kernel entry whose mangled name contains every --match string: the PTX instructions of the whole
kernel and of its innermost loop body (the instructions between a loop's label and the branch back to it; the
loop with the most instructions is taken), by opcode; and ptxas's registers and stack frame. PTX is not SASS
(ptxas folds address arithmetic into the loads' offsets, among others), so compare counts of two versions of a
kernel, not a count with the hardware's issue rate.

  python3 bench/ptx_count.py src/backend/cuda/gemv_quant_direct.cu --match DTypeE8ELi1E --match EpilogueE0
"""
import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compile_cu(cu, arch):
    flags = ["-std=c++20", "-O3", f"-arch={arch}", "--expt-relaxed-constexpr", f"-I{ROOT / 'src'}",
             f"-I{ROOT / 'include'}"]
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        subprocess.run(["nvcc", *flags, "-ptx", str(cu), "-o", str(ptx)], check=True)
        res = subprocess.run(["nvcc", *flags, "-Xptxas", "-v", "-c", str(cu), "-o", str(Path(tmp) / "k.o")],
                             check=True, capture_output=True, text=True)
        return ptx.read_text(), res.stderr


def instructions(lines):
    out = []
    for raw in lines:
        s = raw.strip()
        if not s or s.startswith(("//", ".", "{", "}")) or s.endswith(":"):
            continue
        if s.startswith("@"):  # predicated: the opcode follows the guard
            s = s.split(None, 1)[1] if " " in s else s
        out.append(s)
    return out


def opcode(ins):
    return ".".join(ins.split()[0].split(".")[:2])


def innermost_loop(body_lines):
    labels = {}
    best = []
    for i, raw in enumerate(body_lines):
        s = raw.strip()
        m = re.match(r"(\$L__\w+):", s)
        if m:
            labels[m.group(1)] = i
        m = re.search(r"bra(?:\.uni)?\s+(\$L__\w+);", s)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loop = instructions(body_lines[labels[m.group(1)]:i + 1])
            if len(loop) > len(best):
                best = loop
    return best


def resources(ptxas_log):
    res, cur = {}, None
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            continue
        if cur is None:
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            res.setdefault(cur, {})["registers"] = int(m.group(1))
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
        if m:
            res.setdefault(cur, {})["stack"] = int(m.group(1))
            res.setdefault(cur, {})["spill"] = int(m.group(2))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cu")
    ap.add_argument("--match", action="append", default=[], help="substring of the mangled kernel name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--top", type=int, default=12, help="opcodes listed per kernel")
    args = ap.parse_args()
    ptx, log = compile_cu(args.cu, args.arch)
    res = resources(log)
    found = False
    for entry in re.split(r"\n\.(?:visible \.)?entry ", ptx)[1:]:
        name = entry.split("(")[0].strip()
        if not all(m in name for m in args.match):
            continue
        found = True
        body = entry.splitlines()
        whole = instructions(body)
        loop = innermost_loop(body)
        r = res.get(name, {})
        print(name)
        print(f"  registers {r.get('registers')}, stack {r.get('stack')} B, spill stores {r.get('spill')} B")
        print(f"  PTX instructions: kernel {len(whole)}, largest loop body {len(loop)}")
        top = collections.Counter(opcode(i) for i in loop).most_common(args.top)
        print("  loop by opcode: " + ", ".join(f"{k} {v}" for k, v in top))
    if not found:
        sys.exit("no kernel matched " + " and ".join(args.match))


if __name__ == "__main__":
    main()
