#!/usr/bin/env python3
"""Golden outputs of the built-in model from Hugging Face transformers, and a cross-check of
train.py's own forward pass against it.

    python3 golden.py ARTIFACT PROMPTS_JSON OUTDIR [--own-only]

Expands ARTIFACT (expand.py) into a temporary checkpoint, loads it with transformers'
GptOssForCausalLM (float32, eager attention, MXFP4 dequantized by transformers: as
tests/data/tiny-gptoss was made), and writes to OUTDIR:
  golden.json                 prompts, greedy continuations (16 tokens, no EOS stop), columns
  golden_logits.safetensors   logits_i [len(prompt_i), len(columns)] float32 at every position
`columns` are the union of each position's top-5 tokens plus 4 tokens never seen in training
(the full 201,088-wide rows would be ~1 MB a position). It also prints how far train.py's model
(float32, weights read back from the artifact) is from transformers: they must agree, else the
architecture written in train.py is not gpt-oss. --own-only skips transformers and uses
train.py's model as the oracle (to try the C++ golden test locally without transformers).
"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import expand  # noqa: E402
import stfile  # noqa: E402
import train  # noqa: E402


def own_model(artifact):
    t, meta = stfile.load(artifact)
    cfg = json.loads(bytes(t["builtin.config"].tolist()).decode())
    ids = t["builtin.token_ids"].long()
    m = train.Model(cfg, len(ids) + 1)
    f = lambda x: x.float()  # noqa: E731
    with torch.no_grad():
        m.embed.copy_(f(t["model.embed_tokens.rows"]))
        m.lm_head.copy_(f(t["lm_head.rows"]))
        m.norm.copy_(f(t["model.norm.weight"]))
        for i, l in enumerate(m.layers):
            p = f"model.layers.{i}."
            l.input_layernorm.copy_(f(t[p + "input_layernorm.weight"]))
            l.post_attention_layernorm.copy_(f(t[p + "post_attention_layernorm.weight"]))
            for n in ["q_proj", "k_proj", "v_proj", "o_proj"]:
                getattr(l, n).weight.copy_(f(t[p + f"self_attn.{n}.weight"]))
                getattr(l, n).bias.copy_(f(t[p + f"self_attn.{n}.bias"]))
            l.sinks.copy_(f(t[p + "self_attn.sinks"]))
            l.router.weight.copy_(f(t[p + "mlp.router.weight"]))
            l.router.bias.copy_(f(t[p + "mlp.router.bias"]))
            for n, w in [("gate_up_proj", l.gate_up_w), ("down_proj", l.down_w)]:
                blocks, scales = t[p + f"mlp.experts.{n}_blocks"], t[p + f"mlp.experts.{n}_scales"]
                codes = torch.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-2], -1)
                w.copy_(train.mxfp4_dequant(codes, scales.long() - 127))
            l.gate_up_b.copy_(f(t[p + "mlp.experts.gate_up_proj_bias"]))
            l.down_b.copy_(f(t[p + "mlp.experts.down_proj_bias"]))
    m.eval()
    return m, ids, cfg


def own_logits(m, seen, V, prompt):
    """Full-vocabulary logits [T, V] of the compact model, as the expanded checkpoint has them."""
    K = len(seen)
    to_compact = torch.full((V,), K, dtype=torch.long)
    to_compact[seen] = torch.arange(K)
    train.CDT = torch.float32
    with torch.no_grad():
        c = m(to_compact[torch.tensor(prompt)][None])[0]
    full = c[:, K:K + 1].expand(len(prompt), V).clone()
    full[:, seen] = c[:, :K]
    return full


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--own-only", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)
    prompts = json.load(open(args.prompts))
    m, seen, cfg = own_model(args.artifact)
    V = cfg["vocab_size"]
    own = [own_logits(m, seen, V, p) for p in prompts]
    if args.own_only:
        # The same files with train.py's model as the oracle: only to test the C++ golden test
        # itself without transformers (say so in "oracle").
        logits, greedy = own, []
        for p in prompts:
            ids = list(p)
            for _ in range(16):
                ids.append(int(own_logits(m, seen, V, ids)[-1].argmax()))
            greedy.append(ids[len(p):])
        oracle = "train.py's own model (NOT transformers: a local stand-in)"
    else:
        logits, greedy, oracle = transformers_oracle(args.artifact, prompts, cfg)
    write(args.out, prompts, logits, greedy, seen, oracle, own)


def transformers_oracle(artifact, prompts, cfg):
    import transformers
    from transformers import GptOssForCausalLM
    print(f"transformers {transformers.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        expand.expand(artifact, d)
        hf = GptOssForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").float()
        hf.eval()
        logits, greedy = [], []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p])
                logits.append(hf(ids).logits[0].float())
                gen = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                  pad_token_id=cfg["pad_token_id"])
                greedy.append(gen[0, len(p):].tolist())
    return logits, greedy, f"transformers {transformers.__version__} GptOssForCausalLM float32 eager (experts upcast to float32)"


def write(out, prompts, logits, greedy, seen, oracle, own):
    worst = 0.0
    for i, (a, b) in enumerate(zip(logits, own)):
        diff = (a - b).abs().max().item()
        rel = diff / a.abs().max().item()
        same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        worst = max(worst, rel)
        print(f"prompt {i} ({len(prompts[i])} tokens): train.py vs the oracle: max |diff| {diff:.3e} "
              f"(relative {rel:.2e}), same argmax {same * 100:.1f}%", flush=True)
    seen_set = set(seen.tolist())
    unseen = [t for t in range(200000) if t not in seen_set][:4]
    cols = set(unseen)
    for l in logits:
        cols.update(torch.topk(l, 5, dim=-1).indices.flatten().tolist())
    cols = sorted(cols)
    ct = torch.tensor(cols)
    stfile.save(os.path.join(out, "golden_logits.safetensors"),
                {f"logits_{i}": l[:, ct].contiguous() for i, l in enumerate(logits)})
    json.dump({"oracle": oracle,
               "prompts": prompts, "greedy_continuations": greedy, "columns": cols,
               "logits_file": "golden_logits.safetensors",
               "logits_tensors": [f"logits_{i}" for i in range(len(logits))],
               "train_py_vs_transformers_max_relative_diff": worst},
              open(os.path.join(out, "golden.json"), "w"))
    print("greedy", greedy, flush=True)
    if worst > 1e-3:
        print(f"ERROR: train.py's forward pass differs from transformers (relative {worst:.2e})", flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
