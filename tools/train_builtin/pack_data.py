#!/usr/bin/env python3
"""Packs rendered and tokenized training units into the files train.py reads.

Input (in --dir): units.jsonl ({"kind": "text"|"chat", ...}) and ids.jsonl (one JSON id array a
line: for "text" one line, for "chat" two lines, the rendered prompt then the completion).
Output (in --dir):
  vocab.json    the sorted original token ids seen (index = compact id; K = "any other token")
  tokens.u16    every unit's compact ids, concatenated (uint16 little endian)
  mask.u8       1 where the token is a training target (text, completions), 0 in chat prompts
  starts.u32    where each unit starts (training windows begin there)
  golden_prompts.json  a few rendered prompts (original ids) for golden.py
  meta.json     counts, for the record
Units with tokens seen fewer than --min-count times are dropped (rare words would cost an
embedding row each for little use), until at most --max-vocab distinct tokens remain.
Standard library only; deterministic.
"""
import argparse
import collections
import json
import os
import random
import struct
import array


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--max-vocab", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    units = [json.loads(l) for l in open(os.path.join(args.dir, "units.jsonl"))]
    lines = open(os.path.join(args.dir, "ids.jsonl")).read().splitlines()
    seqs, i = [], 0  # (ids, first target index)
    for u in units:
        if u["kind"] == "text":
            seqs.append((json.loads(lines[i]), 0)); i += 1
        else:
            p, c = json.loads(lines[i]), json.loads(lines[i + 1]); i += 2
            seqs.append((p + c, len(p)))
    assert i == len(lines), f"{len(lines)} id lines for {i} expected"
    min_count = 1
    while True:
        counts = collections.Counter()
        for ids, _ in seqs:
            counts.update(set(ids))
        rare = {t for t, n in counts.items() if n < min_count}
        kept = [s for s in seqs if not rare.intersection(s[0])]
        vocab = set(t for ids, _ in kept for t in ids)
        print(f"pack: min unit count {min_count}: {len(kept)} of {len(seqs)} units, {len(vocab)} distinct tokens")
        if len(vocab) <= args.max_vocab:
            break
        min_count += 1
    vocab = sorted(vocab)
    compact = {t: j for j, t in enumerate(vocab)}
    random.Random(args.seed).shuffle(kept)
    toks, mask, starts = array.array("H"), array.array("B"), array.array("I")
    for ids, first in kept:
        starts.append(len(toks))
        toks.extend(compact[t] for t in ids)
        mask.extend(0 if j < first else 1 for j in range(len(ids)))
    for name, arr in [("tokens.u16", toks), ("mask.u8", mask), ("starts.u32", starts)]:
        if arr.itemsize > 1 and struct.pack("=H", 1) != struct.pack("<H", 1):
            arr.byteswap()
        with open(os.path.join(args.dir, name), "wb") as f:
            arr.tofile(f)
    json.dump(vocab, open(os.path.join(args.dir, "vocab.json"), "w"))
    # Golden prompts: rendered chat prompts (ending in <|start|>assistant), one with tools, and a
    # long one that crosses the 128-token sliding window.
    chats = [(ids[:first]) for ids, first in kept if first > 0]
    chats.sort(key=len)
    golden = [chats[0], chats[len(chats) // 2], chats[-1]]
    json.dump(golden, open(os.path.join(args.dir, "golden_prompts.json"), "w"))
    meta = {"units": len(kept), "dropped_units": len(seqs) - len(kept), "tokens": len(toks),
            "target_tokens": sum(mask), "distinct_tokens": len(vocab), "min_unit_count": min_count}
    json.dump(meta, open(os.path.join(args.dir, "meta.json"), "w"), indent=1)
    print("pack:", json.dumps(meta))


if __name__ == "__main__":
    main()
