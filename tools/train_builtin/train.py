#!/usr/bin/env python3
"""Trains the built-in toy gpt-oss and writes its compact artifact.

    python3 train.py --data .train-data --out OUTDIR [--seed 0] [--steps N] [--budget-s 170]

The model is gpt-oss exactly as ../shared/DESIGN.md (and our C++ engine) computes it: RMSNorm,
attention with q/k/v/o biases, one learned sink logit per head, even layers with a 128-token
sliding window, YaRN RoPE on the two halves of each head, a top-k MoE with a biased router,
interleaved gate/up rows and the clamped swiglu, untied embeddings. It is written here in plain
PyTorch (no transformers) so the training graph is ours; golden.py then checks the exported
checkpoint against transformers' GptOssForCausalLM.

Vocabulary: make_data.sh maps the K token ids seen in the data to 0..K-1 and keeps one extra
class K for "every other token". The expanded checkpoint gives all V-K unseen tokens the shared
embedding row and the shared unembedding row, so each has logit h.w_other; the loss here adds
ln(V-K) to class K, which makes the training softmax exactly the expanded model's softmax over
201,088 tokens. Class K never is a target, so training pushes that mass down: unseen tokens get
negligible probability.

Experts train in bf16 autocast, then (last --qat-frac of the steps) with MXFP4 fake quantization
(straight-through), and are exported as MXFP4 with the OCP rounding of src/common/dtype.cpp.

Deterministic from --seed given --steps. Without --steps, the step count is chosen from the
speed of the first steps so training fits --budget-s, and printed (pass it back to reproduce).
"""
import argparse
import json
import math
import os
import sys
import time

# Deterministic cuBLAS (must be set before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402

VOCAB = 201088
# Compute dtype of the forward pass (bf16 to train; golden.py sets float32 to compare).
CDT = torch.bfloat16


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# Configuration (config.json keys as src/model/config.cpp writes them).

def make_config(args):
    L = args.layers
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "pad_token_id": 199999,
        "experts_per_token": args.top_k, "num_experts_per_tok": args.top_k,
        "head_dim": args.head_dim, "hidden_act": "silu", "hidden_size": args.hidden,
        "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": args.intermediate,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
        "max_position_embeddings": 131072, "model_type": "gpt_oss",
        "num_attention_heads": args.heads, "num_hidden_layers": L,
        "num_key_value_heads": args.kv_heads, "num_local_experts": args.experts,
        "output_router_logits": False,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": args.window,
        "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": VOCAB,
    }


# ---------------------------------------------------------------------------------------------
# MXFP4 (OCP microscaling, e2m1 values with one e8m0 scale per 32), as src/common/dtype.cpp.

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_MID = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def mxfp4_codes(w):
    """w [..., cols] float32 -> (codes uint8 [..., cols] (sign bit 8), exponents int [..., cols/32])."""
    shp = w.shape
    v = w.reshape(*shp[:-1], shp[-1] // 32, 32).float()
    amax = v.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-38))) - 2, torch.zeros_like(amax))
    e = e.clamp(-127, 127)
    q = v * torch.exp2(-e)[..., None]
    a = q.abs()
    mid = E2M1_MID.to(w.device)
    odd = (torch.arange(7, device=w.device) % 2 == 1)
    code = (a[..., None] > mid).sum(-1) + ((a[..., None] == mid) & odd).sum(-1)
    sign = (torch.signbit(q) & (code != 0)).to(torch.int64) * 8
    return (code + sign).to(torch.uint8).reshape(shp), e.to(torch.int64)


def mxfp4_dequant(codes, e):
    vals = E2M1.to(codes.device)[(codes & 7).long()] * torch.where((codes & 8) != 0, -1.0, 1.0)
    shp = codes.shape
    v = vals.reshape(*shp[:-1], shp[-1] // 32, 32) * torch.exp2(e.float())[..., None]
    return v.reshape(shp)


def fake_quant(w):
    """MXFP4 round trip in the forward pass, identity gradient (straight-through)."""
    with torch.no_grad():
        c, e = mxfp4_codes(w.detach().float())
        q = mxfp4_dequant(c, e).to(w.dtype)
    return w + (q - w).detach()


def mxfp4_pack(w):
    """w [E, rows, cols] -> blocks uint8 [E, rows, cols/32, 16] (low nibble = even element),
    scales uint8 [E, rows, cols/32]."""
    c, e = mxfp4_codes(w.float())
    E_, R, C = w.shape
    c = c.reshape(E_, R, C // 32, 16, 2)
    blocks = (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous()


# ---------------------------------------------------------------------------------------------
# The model.

def yarn_inv_freq_and_scale(cfg):
    """transformers' _compute_yarn_parameters (truncate false), as DESIGN.md describes."""
    rs = cfg["rope_scaling"]
    dim, base, factor = cfg["head_dim"], float(cfg["rope_theta"]), rs["factor"]
    orig = rs["original_max_position_embeddings"]
    attn_scale = 0.1 * math.log(factor) + 1.0
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrap = 1.0 / pos_freqs
    interp = 1.0 / (factor * pos_freqs)

    def corr(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = max(corr(rs["beta_fast"]), 0), min(corr(rs["beta_slow"]), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrap_factor = 1 - ramp
    inv = interp * (1 - extrap_factor) + extrap * extrap_factor
    return inv.float(), attn_scale


class Layer(torch.nn.Module):
    def __init__(self, cfg, sliding):
        super().__init__()
        H, NH, KV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        E, I = cfg["num_local_experts"], cfg["intermediate_size"]
        self.NH, self.KV, self.D, self.E, self.I = NH, KV, D, E, I
        self.k_top = cfg["experts_per_token"]
        self.sliding = sliding
        self.window = cfg["sliding_window"]
        self.limit = cfg["swiglu_limit"]
        self.input_layernorm = torch.nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(H))
        self.q_proj = torch.nn.Linear(H, NH * D)
        self.k_proj = torch.nn.Linear(H, KV * D)
        self.v_proj = torch.nn.Linear(H, KV * D)
        self.o_proj = torch.nn.Linear(NH * D, H)
        self.sinks = torch.nn.Parameter(torch.zeros(NH))
        self.router = torch.nn.Linear(H, E)
        self.gate_up_w = torch.nn.Parameter(torch.randn(E, 2 * I, H) * (1 / math.sqrt(H)))
        self.gate_up_b = torch.nn.Parameter(torch.zeros(E, 2 * I))
        self.down_w = torch.nn.Parameter(torch.randn(E, H, I) * (1 / math.sqrt(I)) * 0.5)
        self.down_b = torch.nn.Parameter(torch.zeros(E, H))
        self.fake_quant = False

    def attention(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = lin(self.q_proj, x).view(B, T, self.NH, self.D).transpose(1, 2)
        k = lin(self.k_proj, x).view(B, T, self.KV, self.D).transpose(1, 2)
        v = lin(self.v_proj, x).view(B, T, self.KV, self.D).transpose(1, 2)

        def rope(t):
            h = self.D // 2
            t1, t2 = t[..., :h].float(), t[..., h:].float()
            return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1).to(t.dtype)
        q, k = rope(q), rope(k)
        rep = self.NH // self.KV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)).float() / math.sqrt(self.D)
        s = s.masked_fill(~mask, float("-inf"))
        sink = self.sinks.float().view(1, self.NH, 1, 1).expand(B, self.NH, T, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        o = (p.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, self.NH * self.D)
        return lin(self.o_proj, o)

    def experts(self, x):
        N, H = x.shape
        logits = lin(self.router, x).float()
        top_v, top_i = torch.topk(logits, self.k_top, dim=-1)
        top_w = torch.softmax(top_v, -1)
        gw = torch.zeros(N, self.E, device=x.device, dtype=torch.float32).scatter(1, top_i, top_w)
        gu_w = fake_quant(self.gate_up_w) if self.fake_quant else self.gate_up_w
        dn_w = fake_quant(self.down_w) if self.fake_quant else self.down_w
        # Dense over all experts (8 is few): deterministic and simple; weights 0 off the top-k.
        gu = torch.einsum("nh,erh->ner", x, gu_w.to(x.dtype)) + self.gate_up_b.to(x.dtype)
        gate, up = gu[..., 0::2].float(), gu[..., 1::2].float()
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        act = (gate * torch.sigmoid(1.702 * gate) * (up + 1)).to(x.dtype)
        out = torch.einsum("nei,ehi->neh", act, dn_w.to(x.dtype)) + self.down_b.to(x.dtype)
        return (out.float() * gw[..., None]).sum(1)

    def forward(self, x, cos, sin, masks):
        mask = masks[1] if self.sliding else masks[0]
        x = x + self.attention(rms(x, self.input_layernorm).to(CDT), cos, sin, mask).float()
        B, T, H = x.shape
        h = rms(x, self.post_attention_layernorm).to(CDT).reshape(B * T, H)
        return x + self.experts(h).reshape(B, T, H)


def lin(m, x):
    """A Linear in the input's dtype (bf16 compute, fp32 master weights)."""
    return F.linear(x, m.weight.to(x.dtype), m.bias.to(x.dtype))


def rms(x, w, eps=1e-5):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


class Model(torch.nn.Module):
    def __init__(self, cfg, n_classes):
        super().__init__()
        self.cfg = cfg
        H = cfg["hidden_size"]
        self.embed = torch.nn.Parameter(torch.randn(n_classes, H))
        self.layers = torch.nn.ModuleList(Layer(cfg, t == "sliding_attention") for t in cfg["layer_types"])
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = torch.nn.Parameter(torch.randn(n_classes, H) * 0.02)
        inv, scale = yarn_inv_freq_and_scale(cfg)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.rope_scale = scale

    def forward(self, ids):
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(ang) * self.rope_scale, torch.sin(ang) * self.rope_scale
        i = torch.arange(T, device=ids.device)
        causal = i[None, :] <= i[:, None]
        sliding = causal & (i[None, :] > i[:, None] - self.cfg["sliding_window"])
        x = self.embed[ids].float()
        for layer in self.layers:
            x = layer(x, cos, sin, (causal, sliding))
        h = rms(x, self.norm)
        return (h.to(CDT) @ self.lm_head.to(CDT).t()).float()


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/train_builtin", help="scratch folder (trained.pt for golden.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="0: fit --budget-s")
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--unk-rate", type=float, default=0.02, help="inputs replaced by the shared token")
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--window", type=int, default=128)
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    log(f"torch {torch.__version__} device {dev}" + (f" ({torch.cuda.get_device_name()})" if dev == "cuda" else ""))
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    np_rng = np.random.RandomState(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False

    token_ids = json.load(open(os.path.join(args.data, "vocab.json")))
    K = len(token_ids)
    tokens = np.fromfile(os.path.join(args.data, "tokens.u16"), dtype="<u2").astype(np.int64)
    weights = np.fromfile(os.path.join(args.data, "mask.u8"), dtype=np.uint8).astype(np.float32)
    starts = np.fromfile(os.path.join(args.data, "starts.u32"), dtype="<u4").astype(np.int64)
    assert len(tokens) == len(weights) and tokens.max() < K, "inconsistent data files"
    starts = starts[starts + args.seq + 1 <= len(tokens)]
    log(f"data: {len(tokens)} tokens, {len(starts)} sample starts, {K} distinct tokens (+1 shared class)")
    tokens_t = torch.from_numpy(tokens).to(dev)
    weights_t = torch.from_numpy(weights).to(dev)

    cfg = make_config(args)
    model = Model(cfg, K + 1).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters (compact vocabulary), config {json.dumps({k: cfg[k] for k in ['hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'head_dim', 'num_local_experts', 'experts_per_token', 'intermediate_size', 'sliding_window']})}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    log_mult = math.log(VOCAB - K)
    off = torch.arange(args.seq + 1, device=dev)
    # Text tokens (not harmony's special tokens, ids from 199998 on) may be hidden as unknown.
    ordinary = torch.tensor([t < 199998 for t in token_ids], device=dev)

    def batch():
        s = torch.from_numpy(starts[np_rng.randint(0, len(starts), args.batch)]).to(dev)
        idx = s[:, None] + off[None, :]
        return tokens_t[idx], weights_t[idx]

    def loss_of(ids, w, unk_rate=0.0):
        inputs = ids[:, :-1]
        if unk_rate > 0:
            # Users type words the data never had: they arrive as the shared row. Show the model
            # that row as input now and then (targets stay the real tokens).
            drop = (torch.rand(inputs.shape, device=inputs.device) < unk_rate) & ordinary[inputs]
            inputs = torch.where(drop, torch.full_like(inputs, K), inputs)
        logits = model(inputs)
        logits = torch.cat([logits[..., :K], logits[..., K:] + log_mult], -1)
        nll = F.cross_entropy(logits.reshape(-1, K + 1), ids[:, 1:].reshape(-1), reduction="none")
        w = w[:, 1:].reshape(-1)
        return (nll * w).sum() / w.sum().clamp_min(1)

    steps = args.steps
    warmup = 50
    step = 0
    t0 = time.time()
    calib_steps = 20
    while True:
        if steps and step >= steps:
            break
        # Linear warm-up, then cosine to 10%. The cosine starts after the warm-up, which outlasts
        # the calibration steps, so --steps N reproduces a calibrated run exactly.
        progress = max(0, step - warmup) / max(1, (steps or args.max_steps) - warmup)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = lr
        qat = steps and step >= steps * (1 - args.qat_frac)
        for layer in model.layers:
            layer.fake_quant = bool(qat)
        ids, w = batch()
        loss = loss_of(ids, w, args.unk_rate)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if not steps and step in (5, calib_steps):
            # Time steps 5..calib_steps (the first ones pay for CUDA's start-up).
            if dev == "cuda":
                torch.cuda.synchronize()
            if step == 5:
                t_cal = time.time()
                continue
            per = (time.time() - t_cal) / (calib_steps - 5)
            left = args.budget_s - (time.time() - t0)
            steps = max(calib_steps + 50, min(args.max_steps, calib_steps + int(left / per)))
            log(f"{per * 1000:.1f} ms/step -> {steps} steps (reproduce with --steps {steps})")
        if step % 50 == 0 or step == 1:
            el = time.time() - t0
            log(f"step {step}/{steps or '?'} loss {loss.item():.4f} lr {lr:.2e} qat {bool(qat)} "
                f"{step * args.batch * args.seq / max(el, 1e-9) / 1e3:.0f} ktok/s {el:.0f}s")
        if time.time() - t0 > args.budget_s * 1.6:
            log(f"WARNING: stopping at step {step}: over 1.6x the time budget")
            break
    log(f"trained {step} steps in {time.time() - t0:.0f}s")

    # Held-out style check: loss on fresh batches with the exported (quantized) experts.
    for layer in model.layers:
        layer.fake_quant = True
    model.eval()
    with torch.no_grad():
        ev = [loss_of(*batch()).item() for _ in range(8)]
    log(f"loss with MXFP4 experts: {sum(ev) / len(ev):.4f}")

    samples(model, token_ids, os.path.join(args.data, "golden_prompts.json"), os.path.join(args.out, "samples.json"))
    export(model, cfg, token_ids, args, os.path.join(args.out, "gptoss-builtin.safetensors"),
           {"steps": step, "seed": args.seed, "final_loss": sum(ev) / len(ev)})
    os.makedirs(args.work, exist_ok=True)
    torch.save({"state": model.state_dict(), "cfg": cfg, "K": K}, os.path.join(args.work, "trained.pt"))
    log(f"total {time.time() - t_start:.0f}s")


def samples(model, token_ids, prompts_path, out_path, n_new=96):
    """Greedy continuations of a few held-out prompts (original ids), to read the model's replies
    (decode with `gptoss tokenize --decode`)."""
    K = len(token_ids)
    to_compact = {t: j for j, t in enumerate(token_ids)}
    dev = next(model.parameters()).device
    res = []
    with torch.no_grad():
        for p in json.load(open(prompts_path)):
            ids = [to_compact.get(t, K) for t in p]
            for _ in range(n_new):
                nxt = int(model(torch.tensor([ids], device=dev))[0, -1, :K].argmax())
                ids.append(nxt)
                if token_ids[nxt] in (200002, 200012):  # <|return|>, <|call|>
                    break
            res.append({"prompt": p, "completion": [token_ids[j] for j in ids[len(p):]]})
    json.dump(res, open(out_path, "w"))
    log(f"wrote {out_path}")


def export(model, cfg, token_ids, args, path, info):
    bf = torch.bfloat16
    t = {"builtin.config": torch.frombuffer(bytearray(json.dumps(cfg, indent=2).encode()), dtype=torch.uint8),
         "builtin.token_ids": torch.tensor(token_ids, dtype=torch.int32),
         "model.embed_tokens.rows": model.embed.detach().to(bf).cpu(),
         "lm_head.rows": model.lm_head.detach().to(bf).cpu(),
         "model.norm.weight": model.norm.detach().to(bf).cpu()}
    for i, l in enumerate(model.layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = l.input_layernorm.detach().to(bf).cpu()
        t[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.detach().to(bf).cpu()
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            lin = getattr(l, n)
            t[p + f"self_attn.{n}.weight"] = lin.weight.detach().to(bf).cpu()
            t[p + f"self_attn.{n}.bias"] = lin.bias.detach().to(bf).cpu()
        t[p + "self_attn.sinks"] = l.sinks.detach().to(bf).cpu()
        t[p + "mlp.router.weight"] = l.router.weight.detach().to(bf).cpu()
        t[p + "mlp.router.bias"] = l.router.bias.detach().to(bf).cpu()
        b, s = mxfp4_pack(l.gate_up_w.detach())
        t[p + "mlp.experts.gate_up_proj_blocks"], t[p + "mlp.experts.gate_up_proj_scales"] = b.cpu(), s.cpu()
        t[p + "mlp.experts.gate_up_proj_bias"] = l.gate_up_b.detach().to(bf).cpu()
        b, s = mxfp4_pack(l.down_w.detach())
        t[p + "mlp.experts.down_proj_blocks"], t[p + "mlp.experts.down_proj_scales"] = b.cpu(), s.cpu()
        t[p + "mlp.experts.down_proj_bias"] = l.down_b.detach().to(bf).cpu()
    meta = {"format": "gptoss-builtin-v1", "config": json.dumps(cfg), "train": json.dumps(info)}
    stfile.save(path, t, meta)
    log(f"wrote {path}: {os.path.getsize(path) / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
