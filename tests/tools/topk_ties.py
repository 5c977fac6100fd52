#!/usr/bin/env python3
"""Prints torch.topk's choice among exactly tied values, on the CPU and (when there is one) on
CUDA, for a few tie patterns, dtypes and row lengths (8 = the tiny fixtures' experts, 32 =
gpt-oss-20b's, 128 = 120b's). The engine routes exact ties to the lower expert index
(src/backend/cpu/cpu_ops.cpp router_topk, src/backend/cuda/elementwise.cu topk_token); this
shows whether transformers (which calls torch.topk) does the same on each device.

  python3 tests/tools/topk_ties.py [--json FILE]
One line per case: device dtype E k pattern -> indices; "rule" says lower/higher/other."""
import argparse, json, torch


def patterns(E):
    z = [0.0] * E
    out = {}
    out["all equal"] = list(z)
    v = [-1.0] * E; v[1] = v[E - 2] = 2.0
    out["two tied for first (1, E-2)"] = v
    v = [-1.0] * E; v[0] = 3.0; v[2] = v[5] = v[E - 1] = 1.0
    out["first clear, three tied for second (2, 5, E-1)"] = v
    v = [float(i % 3) for i in range(E)]
    out["repeating 0,1,2"] = v
    v = [-1.0] * E; v[E - 1] = v[E - 3] = 0.5
    out["tie at the end (E-3, E-1)"] = v
    return out


def rule(vals, idx, k):
    """lower: every tie across the boundary went to the lower indices; higher: to the higher."""
    kth = vals[idx[-1]]
    tied = [i for i, x in enumerate(vals) if x == kth]
    chosen = [i for i in idx if vals[i] == kth]
    if len(chosen) == len(tied):
        return "no boundary tie"
    if chosen == tied[:len(chosen)]:
        return "lower"
    if chosen == tied[-len(chosen):]:
        return "higher"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    print("torch", torch.__version__, "devices", devices, flush=True)
    for dev in devices:
        for dtype in (torch.float32, torch.bfloat16):
            for E in (8, 32, 128):
                for k in (1, 2, 4):
                    for name, vals in patterns(E).items():
                        x = torch.tensor(vals, dtype=dtype, device=dev)
                        for batch in (1, 64):  # a batch of identical rows takes other kernels on CUDA
                            idx = torch.topk(x.expand(batch, E).contiguous(), k, dim=-1).indices
                            got = [[int(i) for i in r] for r in idx.cpu()]
                            same = all(g == got[0] for g in got)
                            r = rule(vals, got[0], k)
                            rows.append({"device": dev, "dtype": str(dtype), "E": E, "k": k, "pattern": name,
                                         "batch": batch, "indices": got[0], "rows_agree": same, "rule": r})
                            print(f"{dev:4} {str(dtype):14} E={E:3} k={k} batch={batch:2} {name:48} -> {got[0]} "
                                  f"{r}{'' if same else ' (rows differ!)'}")
    rules = {}
    for r in rows:
        if r["rule"] != "no boundary tie":
            rules.setdefault(r["device"], set()).add(r["rule"])
    for dev, s in rules.items():
        print(f"summary {dev}: ties across the top-k boundary resolved toward: {', '.join(sorted(s))}")
    if a.json:
        json.dump({"torch": torch.__version__, "cases": rows,
                   "summary": {d: sorted(s) for d, s in rules.items()}}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
