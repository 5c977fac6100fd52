#!/usr/bin/env python3
"""Builds tiny gpt-oss checkpoints in the real HF layout (MXFP4 experts) and golden outputs from
Hugging Face transformers (float32). Needs torch, transformers and safetensors (the GPU machine
has them; the model itself runs on the CPU, so no GPU is needed).

  python3 tests/tools/make_golden.py OUTDIR [--only NAME ...]

Fixtures (each written to OUTDIR/NAME):
  tiny-gptoss        tests/data/tiny-gptoss: the golden of the CPU backend (seed 7). Rebuilding
                     it gives the same checkpoint bytes (same seed, same draw order).
  tiny-gptoss-clamp  tests/data/tiny-gptoss-clamp: the same shapes with larger gate_up MXFP4
                     scales, so the swiglu clamp (limit 7) fires on a good share of the routed
                     (token, expert) pairs, and two experts with identical router rows per layer,
                     so exact router ties occur on the top-k boundary and transformers'
                     torch.topk tie rule is recorded. golden.json also holds what the run saw:
                     "swiglu_clamp" (counts of clamped gate/up values) and "router_ties" (each
                     tie on the top-k boundary and the expert torch.topk chose).
"""
import argparse, torch, json, os, sys, math, inspect
from safetensors.torch import save_file
import transformers
from transformers import GptOssConfig, GptOssForCausalLM

def build(out, seed, H, I, L, NH, NKV, HD, E, K, V, SW, shards=2, gate_up_scales=(119, 123), tied_router=None):
    """gate_up_scales: [lo, hi) of the e8m0 scales of gate_up_proj (119..122 -> 2^-8..2^-5).
    tied_router: {layer: (a, b)}: expert b's router row and bias are copied from expert a's
    (after all draws, so the other tensors are those of the same seed without ties)."""
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    cfg = {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": V - 2, "pad_token_id": V - 3, "experts_per_token": K, "num_experts_per_tok": K,
        "head_dim": HD, "hidden_act": "silu", "hidden_size": H, "initial_context_length": 4096,
        "initializer_range": 0.02, "intermediate_size": I, "layer_types": layer_types,
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": NH,
        "num_hidden_layers": L, "num_key_value_heads": NKV, "num_local_experts": E,
        "output_router_logits": False,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": SW, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": V,
    }
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)
    def rn(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)
    def mx(E_, rows, cols, scale_range=(119, 123)):
        blocks = torch.randint(0, 256, (E_, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(scale_range[0], scale_range[1], (E_, rows, cols // 32), generator=g, dtype=torch.uint8)
        return blocks, scales
    t = {}
    t["model.embed_tokens.weight"] = rn(V, H, std=1.0)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1 + torch.randn(H, generator=g) * 0.1).to(torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = (1 + torch.randn(H, generator=g) * 0.1).to(torch.bfloat16)
        t[p + "self_attn.q_proj.weight"] = rn(NH * HD, H, std=0.05); t[p + "self_attn.q_proj.bias"] = rn(NH * HD)
        t[p + "self_attn.k_proj.weight"] = rn(NKV * HD, H, std=0.05); t[p + "self_attn.k_proj.bias"] = rn(NKV * HD)
        t[p + "self_attn.v_proj.weight"] = rn(NKV * HD, H, std=0.05); t[p + "self_attn.v_proj.bias"] = rn(NKV * HD)
        t[p + "self_attn.o_proj.weight"] = rn(H, NH * HD, std=0.05); t[p + "self_attn.o_proj.bias"] = rn(H)
        t[p + "self_attn.sinks"] = (torch.randn(NH, generator=g)).to(torch.bfloat16)
        t[p + "mlp.router.weight"] = rn(E, H, std=0.1); t[p + "mlp.router.bias"] = rn(E, std=0.1)
        b, s = mx(E, 2 * I, H, gate_up_scales)
        t[p + "mlp.experts.gate_up_proj_blocks"] = b; t[p + "mlp.experts.gate_up_proj_scales"] = s
        t[p + "mlp.experts.gate_up_proj_bias"] = rn(E, 2 * I, std=0.1)
        b, s = mx(E, H, I)
        t[p + "mlp.experts.down_proj_blocks"] = b; t[p + "mlp.experts.down_proj_scales"] = s
        t[p + "mlp.experts.down_proj_bias"] = rn(E, H, std=0.1)
    t["model.norm.weight"] = (1 + torch.randn(H, generator=g) * 0.1).to(torch.bfloat16)
    t["lm_head.weight"] = rn(V, H, std=0.05)
    for layer, (a, b) in (tied_router or {}).items():
        p = f"model.layers.{layer}.mlp.router."
        t[p + "weight"][b] = t[p + "weight"][a]
        t[p + "bias"][b] = t[p + "bias"][a]
    names = list(t.keys())
    per = math.ceil(len(names) / shards)
    wmap = {}; total = 0
    for si in range(shards):
        fn = f"model-{si:05d}-of-{shards - 1:05d}.safetensors"
        part = {n: t[n].contiguous() for n in names[si * per:(si + 1) * per]}
        save_file(part, f"{out}/{fn}", metadata={"format": "pt"})
        for n in part: wmap[n] = fn; total += part[n].numel() * part[n].element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, open(f"{out}/model.safetensors.index.json", "w"), indent=2)
    return cfg, t

# transformers keeps the dequantized experts in bf16 and casts activations to them; .float()
# makes the whole computation float32, which is what an exact engine must match.
torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant_mxfp4(blocks, scales):
    """[E, rows, K/32, 16] uint8 codes (low nibble first) + [E, rows, K/32] e8m0 -> [E, rows, K] float32."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.float() - 127.0).unsqueeze(-1)
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1)


class Recorder:
    """Forward pre-hooks on each layer's mlp: its input is the post-attention-norm hidden state,
    from which the router logits (with the model's own router parameters and F.linear, as the
    router computes them) and each routed expert's gate_up (from the checkpoint's MXFP4 codes)
    follow. Records router ties on the top-k boundary and how often the swiglu clamp fires."""

    def __init__(self, model, cfg, tensors):
        self.cfg, self.k, self.limit = cfg, cfg["num_experts_per_tok"], cfg["swiglu_limit"]
        self.ties, self.prompt, self.enabled = [], -1, False
        self.clamp = {"limit": self.limit, "routed_pairs": 0, "gate_above_limit": 0, "up_outside_limit": 0,
                      "max_abs_gate": 0.0, "max_abs_up": 0.0}
        self.gate_up = []
        for i, layer in enumerate(model.model.layers):
            p = f"model.layers.{i}.mlp.experts."
            w = dequant_mxfp4(tensors[p + "gate_up_proj_blocks"], tensors[p + "gate_up_proj_scales"])
            self.gate_up.append((w, tensors[p + "gate_up_proj_bias"].float()))
            layer.mlp.register_forward_pre_hook(self.hook(i, layer.mlp.router), with_kwargs=True)

    def hook(self, li, router):
        def pre(module, args, kwargs):
            if not self.enabled:
                return
            h = args[0] if args else kwargs["hidden_states"]
            x = h.reshape(-1, h.shape[-1]).float()
            logits = torch.nn.functional.linear(x, router.weight, router.bias)
            vals, idx = torch.topk(logits, self.k, dim=-1)
            srt = torch.sort(logits, dim=-1, descending=True).values
            for r in range(logits.shape[0]):
                kth = srt[r, self.k - 1]
                if srt[r, self.k] == kth:  # a tie across the top-k boundary: the rule decides
                    tied = [int(e) for e in (logits[r] == kth).nonzero().flatten()]
                    self.ties.append({"prompt": self.prompt, "row": r, "layer": li, "value": float(kth),
                                      "tied_experts": tied, "topk": [int(e) for e in idx[r]]})
            w, b = self.gate_up[li]
            for r in range(x.shape[0]):
                for e in idx[r].tolist():
                    gu = w[e] @ x[r] + b[e]
                    gate, up = gu[0::2], gu[1::2]
                    c = self.clamp
                    c["routed_pairs"] += 1
                    c["gate_above_limit"] += int((gate > self.limit).sum())
                    c["up_outside_limit"] += int((up.abs() > self.limit).sum())
                    c["max_abs_gate"] = max(c["max_abs_gate"], float(gate.abs().max()))
                    c["max_abs_up"] = max(c["max_abs_up"], float(up.abs().max()))
        return pre


def golden(out, cfg, seed, prompt_lens, gen_tokens, tensors=None, record=False):
    """record: also write what the prefill passes saw (router ties, swiglu clamp counts) into
    golden.json, and fail unless both occur (the fixture exists to exercise them)."""
    model = GptOssForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").float()
    model.eval()
    sd = model.state_dict()
    print("loaded; sample param dtypes:", {k: str(v.dtype) for k, v in list(sd.items())[:3]}, "n params", len(sd), flush=True)
    print([k for k in sd if "layers.0" in k], flush=True)
    rec = Recorder(model, cfg, tensors) if record else None
    g = torch.Generator().manual_seed(seed + 1)
    V = cfg["vocab_size"]
    res = {"prompts": [], "logits_all": [], "greedy": []}
    with torch.no_grad():
        for i, n in enumerate(prompt_lens):
            ids = torch.randint(0, V - 4, (1, n), generator=g)
            if rec:
                rec.prompt, rec.enabled = i, True
            logits = model(ids).logits[0].float()
            if rec:
                rec.enabled = False
            gen = model.generate(ids, max_new_tokens=gen_tokens, do_sample=False, eos_token_id=None, pad_token_id=cfg["pad_token_id"])
            res["prompts"].append(ids[0].tolist())
            res["logits_all"].append(logits)
            res["greedy"].append(gen[0, n:].tolist())
    tensors_out = {f"logits_{i}": l.contiguous() for i, l in enumerate(res["logits_all"])}
    save_file(tensors_out, f"{out}/golden_logits.safetensors")
    meta = {"oracle": f"transformers {transformers.__version__} GptOssForCausalLM float32 eager (experts upcast to float32)",
            "torch": torch.__version__, "prompts": res["prompts"], "greedy_continuations": res["greedy"],
            "logits_file": "golden_logits.safetensors", "logits_tensors": list(tensors_out.keys())}
    if rec:
        lower = sum(1 for t in rec.ties if min(t["tied_experts"]) in t["topk"] and max(t["tied_experts"]) not in t["topk"])
        higher = sum(1 for t in rec.ties if max(t["tied_experts"]) in t["topk"] and min(t["tied_experts"]) not in t["topk"])
        meta["router_ties"] = rec.ties
        meta["router_tie_rule"] = "lower" if lower and not higher else "higher" if higher and not lower else "mixed"
        meta["swiglu_clamp"] = rec.clamp
        print("router ties on the top-k boundary:", len(rec.ties), "won by the lower index:", lower, "by the higher:", higher, flush=True)
        print("swiglu clamp:", rec.clamp, flush=True)
        if not rec.ties:
            sys.exit("no exact router tie on the top-k boundary: the tied router rows did not give equal logits")
        if rec.clamp["gate_above_limit"] == 0 or rec.clamp["up_outside_limit"] == 0:
            sys.exit("the swiglu clamp never fired: raise gate_up_scales")
    json.dump(meta, open(f"{out}/golden.json", "w"))
    print("greedy", res["greedy"], flush=True)


FIXTURES = ["tiny-gptoss", "tiny-gptoss-clamp"]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--only", nargs="+", choices=FIXTURES, default=FIXTURES)
    a = ap.parse_args()
    shape = dict(H=64, I=64, L=2, NH=4, NKV=1, HD=64, E=8, K=2, V=512, SW=8, shards=1)
    if "tiny-gptoss" in a.only:
        c, t = build(f"{a.outdir}/tiny-gptoss", 7, **shape)
        golden(f"{a.outdir}/tiny-gptoss", c, 7, [1, 20, 45], 16)
    if "tiny-gptoss-clamp" in a.only:
        # gate_up scales 2^-5..2^-2 (codes up to 6): gate/up values of std ~3.4, a few % past 7.
        # Layer 0 ties experts 2 and 5, layer 1 experts 3 and 6: the tied pair sits on the
        # top-2 boundary for about 1 token in 7.
        out = f"{a.outdir}/tiny-gptoss-clamp"
        c, t = build(out, 11, **shape, gate_up_scales=(122, 126), tied_router={0: (2, 5), 1: (3, 6)})
        golden(out, c, 11, [1, 20, 45], 16, tensors=t, record=True)
