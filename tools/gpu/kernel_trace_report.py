#!/usr/bin/env python3
"""What each kernel of a replayed CUDA graph costs inside the step, from a kernel_trace CSV
(src/tools/kernel_trace: CUDA_INJECTION64_PATH=build/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=F).

With programmatic dependent launch a kernel starts (its blocks resident, waiting) long before the
one ahead of it ends, so a kernel's own start-to-end overstates its cost. What a kernel adds to a
chain is how much later it ends than the kernel ahead of it: `adds` below. Kernels are grouped by
replay (graph id, the launch's correlation id); each node's figures are medians over the replays
of the graph named (default: the graph replayed most often).

  kernel_trace_report.py trace.csv[.gz] [--graph ID] [--nodes] [--skip N]
  kernel_trace_report.py new.csv[.gz] --against old.csv[.gz]   (per kernel: adds in both, the change)
"""
import argparse
import collections
import csv
import gzip
import re
import statistics


def short(name, grid):
    base = re.sub(r"^void ", "", name)
    base = re.sub(r"\(.*$", "", base) if "<" not in base else base[: base.rfind("(")] if "(" in base else base
    base = re.sub(r"gptoss::cuda::|\(anonymous namespace\)::|skinny::|router_fold::", "", base)
    base = base.replace("WeightMat::", "").replace("(WeightMat::Format)", "")
    return f"{base[:110]} [{grid}]"


def summarize(path, graph, skip, nodes=False, quiet=False):
    """Reads one trace; prints its header (and, with nodes, every node); returns the replay period
    (us) and the per-kernel families: label -> [count, summed median adds ns, summed median own ns]."""
    say = (lambda *x: None) if quiet else print
    opener = gzip.open if path.endswith(".gz") else open
    rows = list(csv.DictReader(opener(path, "rt")))
    replays = collections.defaultdict(list)
    for r in rows:
        if r["graph_id"] != "0":
            replays[(int(r["graph_id"]), int(r["correlation"]))].append(r)
    per_graph = collections.Counter(g for g, _ in replays)
    if not per_graph:
        say("no graph-launched kernels in", path)
        return None
    say("graphs (id: replays, kernels a replay):",
          ", ".join(f"{g}: {n}, {len(next(v for k, v in replays.items() if k[0] == g))}"
                    for g, n in per_graph.most_common(8)))
    gid = graph if graph is not None else per_graph.most_common(1)[0][0]
    reps = [sorted(v, key=lambda r: int(r["start_ns"])) for (g, c), v in sorted(replays.items()) if g == gid]
    reps = reps[skip:] if len(reps) > skip + 2 else reps
    n = len(reps[0])
    reps = [r for r in reps if len(r) == n]
    spans, periods = [], []
    for i, r in enumerate(reps):
        spans.append(int(r[-1]["end_ns"]) - int(r[0]["start_ns"]))
        if i:
            periods.append(int(r[0]["start_ns"]) - int(reps[i - 1][0]["start_ns"]))
    # Per node (by node id: the same node in every replay), in the first replay's start order.
    order = [x["node_id"] for x in reps[0]]
    adds = collections.defaultdict(list)
    durs = collections.defaultdict(list)
    gaps = collections.defaultdict(list)
    for r in reps:
        prev_end = None
        for x in r:
            s, e = int(x["start_ns"]), int(x["end_ns"])
            durs[x["node_id"]].append(e - s)
            adds[x["node_id"]].append(e - prev_end if prev_end is not None else e - s)
            gaps[x["node_id"]].append(s - prev_end if prev_end is not None else 0)
            prev_end = max(prev_end or 0, e)
    label = {x["node_id"]: short(x["name"], x["grid"]) for x in reps[0]}
    med = statistics.median
    period = med(periods) / 1e3 if periods else 0.0
    say(f"graph {gid}: {len(reps)} replays of {n} kernels; first start to last end {med(spans) / 1e3:.1f} us "
        f"(median), replay to replay {period:.1f} us")
    if nodes:
        say(f"{'#':>4} {'adds us':>8} {'own us':>8} {'gap us':>8}  kernel [grid]")
        for i, nid in enumerate(order):
            say(f"{i:4d} {med(adds[nid]) / 1e3:8.2f} {med(durs[nid]) / 1e3:8.2f} {med(gaps[nid]) / 1e3:8.2f}  {label[nid]}")
    fam = collections.OrderedDict()
    for nid in order:
        f = fam.setdefault(label[nid], [0, 0.0, 0.0])
        f[0] += 1
        f[1] += med(adds[nid])
        f[2] += med(durs[nid])
    return period, fam


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graph", type=int, default=None, help="graph id (default: the most replayed)")
    ap.add_argument("--nodes", action="store_true", help="every node, in step order")
    ap.add_argument("--skip", type=int, default=2, help="replays to leave out at the start (warm-up)")
    ap.add_argument("--against", default=None, help="another trace: each kernel's adds in both, and the change")
    a = ap.parse_args()
    got = summarize(a.csv, a.graph, a.skip, a.nodes, quiet=a.against is not None)
    if got is None:
        return
    period, fam = got
    if a.against is None:
        total = sum(f[1] for f in fam.values())
        print(f"{'count':>5} {'adds us':>9} {'share':>6} {'mean adds':>9} {'mean own':>9}  kernel [grid]")
        for k, (c, s_add, s_dur) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
            print(f"{c:5d} {s_add / 1e3:9.1f} {100 * s_add / total:5.1f}% {s_add / c / 1e3:9.2f} {s_dur / c / 1e3:9.2f}  {k}")
        print(f"sum of adds {total / 1e3:.1f} us")
        return
    old = summarize(a.against, a.graph, a.skip, quiet=True)
    if old is None:
        print("no graph-launched kernels in", a.against)
        return
    old_period, old_fam = old
    # Kernels by label (name and grid); one present in only one trace shows a blank on the other side.
    print(f"replay to replay: {period:.1f} us against {old_period:.1f} ({100 * (period / old_period - 1):+.2f}%)")
    print(f"{'adds us':>9} {'against':>9} {'change':>8} {'count':>7}  kernel [grid]")
    keys = sorted(set(fam) | set(old_fam), key=lambda k: -max(fam.get(k, [0, 0])[1], old_fam.get(k, [0, 0])[1]))
    for k in keys:
        new_s, old_s = fam.get(k), old_fam.get(k)
        ns = f"{new_s[1] / 1e3:9.1f}" if new_s else f"{'':>9}"
        os_ = f"{old_s[1] / 1e3:9.1f}" if old_s else f"{'':>9}"
        ch = (new_s[1] if new_s else 0) - (old_s[1] if old_s else 0)
        cnt = f"{new_s[0] if new_s else 0}/{old_s[0] if old_s else 0}"
        print(f"{ns} {os_} {ch / 1e3:+8.1f} {cnt:>7}  {k}")
    tot_new, tot_old = sum(f[1] for f in fam.values()), sum(f[1] for f in old_fam.values())
    print(f"sum of adds {tot_new / 1e3:.1f} us against {tot_old / 1e3:.1f} ({(tot_new - tot_old) / 1e3:+.1f})")


if __name__ == "__main__":
    main()
