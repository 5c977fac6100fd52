#!/usr/bin/env python3
"""Expands the compact built-in artifact into a Hugging Face checkpoint directory
(config.json + model.safetensors), exactly as src/tools/builtin_model.cpp does:

    python3 expand.py ARTIFACT OUTDIR

`model.embed_tokens.weight` and `lm_head.weight` [201088, hidden] take row j of the compact
`*.rows` for token `builtin.token_ids[j]` and the last (shared) row for every other token; all
other tensors are copied. No tokenizer.json (transformers' model does not need it)."""
import json
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402


def expand(artifact, out):
    t, meta = stfile.load(artifact)
    if meta.get("format") != "gptoss-builtin-v1":
        raise SystemExit(f"{artifact}: not a gptoss-builtin-v1 artifact")
    cfg = json.loads(bytes(t.pop("builtin.config").tolist()).decode())
    V = cfg["vocab_size"]
    ids = t.pop("builtin.token_ids").long()
    full = {}
    for compact, name in [("model.embed_tokens.rows", "model.embed_tokens.weight"), ("lm_head.rows", "lm_head.weight")]:
        rows = t.pop(compact)
        w = rows[-1:].expand(V, rows.shape[1]).clone()
        w[ids] = rows[:-1]
        full[name] = w
    full.update(t)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    stfile.save(os.path.join(out, "model.safetensors"), full, {"format": "pt"})
    return cfg


if __name__ == "__main__":
    expand(sys.argv[1], sys.argv[2])
