#!/usr/bin/env python3
"""Whether a CUDA source's kernels compile to the same PTX at two commits (no GPU needed).

A refactor of kernel code (a file split, a helper moved into a header, a launch site changed)
should leave every kernel's instructions as they were. This compiles SOURCE to PTX with the
build's own nvcc command, once from the working tree and once from REV (checked out in a
temporary worktree), and compares every .entry body after renaming what differs for no reason:
virtual registers and labels (numbered in order of appearance), the anonymous namespaces' and
internal statics' path hashes, and .loc line records.

    tools/gpu/ptx_same.py REV src/backend/cuda/kernels/moe/expert_gemm_wgmma_wa.cu [MORE.cu ...]
    tools/gpu/ptx_same.py REV src/a.cu --moved-to src/b.cu   (kernels of a.cu at REV now in a.cu or b.cu)
    tools/gpu/ptx_same.py REV src/a.cu --rename 'REGEX=REPL' --allow-new
        (a template parameter added with a default: now's mangled names mapped back to REV's by
        re.sub over now's PTX; kernels only now, the new instantiations, allowed)

Needs build/ configured with Ninja. Prints each source's verdict; exits 1 if any kernel differs
(then `--diff` prints the first differing kernel's unified diff).
"""
import argparse
import collections
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_command(source):
    cmds = subprocess.run(["ninja", "-C", os.path.join(ROOT, "build"), "-t", "commands", "gptoss"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    path = os.path.join(ROOT, source)
    for c in cmds:
        if " -c " + path + " " in c and "nvcc" in c:
            return c
    sys.exit(f"ptx_same: no nvcc command compiles {source} in build/ (configure and build first)")


def ptx(command, root, source, out):
    args = shlex.split(command)
    # Depfile flags out, -c -> -ptx, the output and every path of this tree -> `root`'s.
    keep = []
    skip = 0
    for a in args:
        if skip:
            skip -= 1
            continue
        if a in ("-MD",):
            continue
        if a in ("-MT", "-MF"):
            skip = 1
            continue
        keep.append(a)
    res = []
    i = 0
    while i < len(keep):
        a = keep[i]
        if a == "-o":
            res += ["-o", out]
            i += 2
            continue
        if a == "-c":
            res.append("-ptx")
        else:
            res.append(a.replace(ROOT + "/src", root + "/src"))
        i += 1
    subprocess.run(res, cwd=os.path.join(ROOT, "build"), check=True)


def kernels(path, renames=()):
    text = open(path).read()
    for pat, repl in renames:
        text = re.sub(pat, repl, text)
    # (With the mangled length before them: a kernel moved to another file keeps its name.)
    text = re.sub(r"\d*_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "ANON", text)
    text = re.sub(r"\d*_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "INTERNAL", text)
    text = re.sub(r"^\s*\.loc.*$", "", text, flags=re.M)
    text = re.sub(r"//.*", "", text)
    out = {}
    for name, body in re.findall(r"\.entry\s+(\S+)\((.*?)\n\}", text, re.S):
        regs, labels = {}, {}

        def reg(m):
            return regs.setdefault(m.group(0), "%" + m.group(1) + str(len(regs)))

        def label(m):
            return labels.setdefault(m.group(0), "L" + str(len(labels)))

        lines = [l.strip() for l in body.split("\n") if l.strip() and not l.strip().startswith(".reg")]
        out[name] = [re.sub(r"\$L__BB\d+_\d+", label, re.sub(r"%(rd|rs|r|p|fd|f|hh|h)(\d+)", reg, l)) for l in lines]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--diff", action="store_true", help="print the first differing kernel's diff")
    ap.add_argument("--moved-to", nargs="+", default=[], metavar="SOURCE",
                    help="sources (new in the working tree) that now hold some of the kernels: theirs count as now's")
    ap.add_argument("--rename", action="append", default=[], metavar="REGEX=REPL",
                    help="re.sub over now's PTX before comparing (e.g. a defaulted template argument's mangling)")
    ap.add_argument("--allow-new", action="store_true", help="kernels only now (new instantiations) do not count")
    o = ap.parse_args()
    renames = [tuple(r.split("=", 1)) for r in o.rename]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        wt = os.path.join(tmp, "base")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", wt, o.rev], check=True)
        try:
            for src in o.sources:
                cmd = compile_command(src)
                a, b = os.path.join(tmp, "base.ptx"), os.path.join(tmp, "new.ptx")
                ptx(cmd, wt, src, a)
                ptx(cmd, ROOT, src, b)
                ka, kb = kernels(a), kernels(b, renames)
                for i, moved in enumerate(o.moved_to):
                    m = os.path.join(tmp, f"moved{i}.ptx")
                    ptx(compile_command(moved), ROOT, moved, m)
                    kb.update(kernels(m, renames))
                if o.allow_new and set(ka) <= set(kb):
                    print(f"{src}: {len(set(kb) - set(ka))} kernels only now (allowed)")
                    kb = {n: kb[n] for n in ka}
                if set(ka) != set(kb):
                    ok = False
                    print(f"{src}: kernels differ: {len(ka)} at {o.rev}, {len(kb)} now "
                          f"(only then: {len(set(ka) - set(kb))}, only now: {len(set(kb) - set(ka))})")
                    continue
                diff = [n for n in ka if ka[n] != kb[n]]
                if not diff:
                    print(f"{src}: {len(ka)} kernels, PTX identical")
                    continue
                ok = False
                same = sum(collections.Counter(ka[n]) == collections.Counter(kb[n]) for n in diff)
                print(f"{src}: {len(diff)} of {len(ka)} kernels differ ({same} only in instruction order)")
                if o.diff:
                    n = diff[0]
                    print("\n".join(difflib.unified_diff(ka[n], kb[n], o.rev, "now", lineterm="", n=1)))
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", wt], check=False)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
