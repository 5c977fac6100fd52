#!/usr/bin/env python3
"""What the eagerly launched kernels (graph id 0: prefill and mixed passes; decode passes run as
graphs) cost, per kernel, from a kernel_trace CSV (src/tools/kernel_trace). For comparing a
server's prefill passes with `bench --pp N --pp-batch B`'s, kernel by kernel.

A kernel's `adds` is how much later it ends than the eager kernel that ended before it (at most
its own duration: the first kernel after an idle gap adds only its own time), so the adds of all
kernels sum to the GPU time of the eager passes, overlap (programmatic dependent launch) counted
once. Kernels are grouped by name with the grid's first dimension dropped (it follows the pass's
token count).

  eager_kernels.py trace.csv[.gz] [--tokens N] [--top K]
    --tokens: the eager passes' tokens in all, for a per-token column (us a token)
"""
import argparse
import collections
import csv
import gzip
import re


def family(name, grid, block):
    base = re.sub(r"^void ", "", name)
    base = base[: base.rfind("(")] if "(" in base else base
    base = re.sub(r"gptoss::cuda::|\(anonymous namespace\)::", "", base)
    g = grid.split("x")
    return f"{base[:100]} [*x{'x'.join(g[1:])} / {block}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--tokens", type=float, default=0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    rows = [r for r in csv.DictReader(opener(a.trace, "rt")) if r["graph_id"] == "0"]
    rows.sort(key=lambda r: int(r["end_ns"]))
    adds = collections.defaultdict(float)
    own = collections.defaultdict(float)
    count = collections.Counter()
    blocks = collections.Counter()
    last_end = 0
    for r in rows:
        s, e = int(r["start_ns"]), int(r["end_ns"])
        f = family(r["name"], r["grid"], r["block"])
        adds[f] += max(min(e - last_end, e - s), 0)  # (last_end 0: its own duration)
        own[f] += e - s
        count[f] += 1
        gx, gy, gz = (int(v) for v in r["grid"].split("x"))
        blocks[f] += gx * gy * gz
        last_end = max(last_end, e)
    total = sum(adds.values())
    print(f"eager kernels: {len(rows)}, GPU time (adds) {total / 1e6:.1f} ms"
          + (f", {total / 1e3 / a.tokens:.2f} us a token over {a.tokens:.0f} tokens" if a.tokens else ""))
    print(f"{'adds ms':>9} {'share':>6} {'us/tok':>7} {'own ms':>9} {'launches':>8} {'blocks/launch':>13}  kernel")
    for f, v in sorted(adds.items(), key=lambda kv: -kv[1])[: a.top]:
        per_tok = f"{v / 1e3 / a.tokens:7.3f}" if a.tokens else "      -"
        print(f"{v / 1e6:9.2f} {100 * v / total:5.1f}% {per_tok} {own[f] / 1e6:9.2f} {count[f]:8d} "
              f"{blocks[f] / count[f]:13.0f}  {f}")


if __name__ == "__main__":
    main()
