"""Simulate batch policies for Max-Gram at B rows from recorded greedy outputs (outputs do not depend on drafting)
and a step-cost table c(B, N) measured in the real loop."""
import json, sys, statistics, math
from collections import defaultdict
import torch
from hf_cascade.drafters.maxgram import MaxGram

import gzip, os
_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "collect.json.gz")
data = json.load(gzip.open(_path, "rt") if _path.endswith(".gz") else open(_path))
mg = MaxGram()
PRI = mg.bucket_priors

# --- cost table ---------------------------------------------------------------------------------
base_g = defaultdict(list)
for s in data["steps"]:
    if s["N"] == 1 and s["batch"] >= 0: base_g[(s["batch"], s["B"])].append(s["s"])
BASE = {k: statistics.median(v) for k, v in base_g.items()}
def base(batch, B):
    while (batch, B) not in BASE and B < 4: B += 1
    return BASE.get((batch, B)) or BASE[(batch, 4)]
groups = defaultdict(list)
for s in data["steps"]:
    if s["batch"] >= 0 and (s["batch"], s["B"]) in BASE: groups[(s["B"], s["N"])].append(s["s"] / BASE[(s["batch"], s["B"])])
tab = {k: statistics.median(v) for k, v in groups.items() if len(v) >= 3}
BATCH = [0]
PREFILL = {}
for x in data["times"]:
    i = x["batch"]
    PREFILL[i] = x["shut"] - sum(s["s"] for s in data["steps"] if s["batch"] == i and s["mode"] == "shut")
import os
if os.environ.get("ROWPREFILL"):
    from collections import defaultdict as _dd
    L = _dd(list)
    for r in data["rows"]: L[r["batch"]].append(len(r["prompt"]) - 1)
    for i in PREFILL:
        real, padded = sum(L[i]), len(L[i]) * max(L[i])
        if 2 * real <= padded: PREFILL[i] *= real / padded
print("prefill+overhead per batch", {i: round(v, 2) for i, v in PREFILL.items()})
def cost(B, N):
    return ratio(B, N) * base(BATCH[0], B)
def ratio(B, N):
    if N == 1: return 1.0
    if (B, N) in tab: return tab[(B, N)]
    ks = sorted(n for (b, n) in tab if b == B)
    if not ks: return ratio(B + 1 if B < 4 else B - 1, N)
    lo = max([n for n in ks if n <= N], default=ks[0]); hi = min([n for n in ks if n >= N], default=ks[-1])
    if lo == hi: return tab[(B, lo)] * (1 + 0.05 * (N - lo))
    return tab[(B, lo)] + (tab[(B, hi)] - tab[(B, lo)]) * (N - lo) / (hi - lo)

# --- per-row drafts -------------------------------------------------------------------------------
rows_by_batch = defaultdict(list)
for r in data["rows"]:
    toks = r["prompt"] + r["gen"]
    P = len(r["prompt"]); G = len(r["gen"])
    cands = []
    for t in range(G):
        seq = toks[: P + t]
        c = mg._candidates(torch.tensor(seq), seq)
        cont = c.tokens.tolist()
        ell = 0
        while ell < len(cont) and P + t + ell < len(toks) and cont[ell] == toks[P + t + ell]:
            ell += 1
        cands.append((c.bucket, len(cont), ell))
    rows_by_batch[r["batch"]].append(dict(G=G, cands=cands))

class Acc:
    def __init__(s): s.a = defaultdict(float); s.t = defaultdict(float)
    def est(s, bucket):
        p = PRI.get(bucket, 0.5); return min(max((s.a[bucket] + 4 * p) / (s.t[bucket] + 4), 1e-3), 0.999)
    def obs(s, bucket, k, acc):
        s.a[bucket] += acc; s.t[bucket] += acc + (1 if acc < k else 0)

def simulate(rows, policy, maxw=10):
    t = [0] * len(rows); total = PREFILL[BATCH[0]]; calls = 0
    accs = [Acc() for _ in rows]; pooled = Acc()
    while True:
        active = [b for b in range(len(rows)) if t[b] < rows[b]["G"]]
        if not active: break
        B = len(active)
        most = min(t[b] for b in active)
        lag = [b for b in active if t[b] == most]
        info = {}
        for b in lag:
            bucket, avail, ell = rows[b]["cands"][t[b]]
            avail = min(avail, rows[b]["G"] - t[b] - 1)
            info[b] = (bucket, avail, ell)
        w = policy(B, info, accs, pooled)
        N = 1
        for b in active:
            if b in info and w > 0:
                bucket, avail, ell = info[b]; k = min(avail, w)
                if k > 0:
                    N = max(N, k + 1); acc = min(ell, k)
                    accs[b].obs(bucket, k, acc); pooled.obs(bucket, k, acc)
                    t[b] += acc + 1
                    continue
            t[b] += 1
        total += cost(B, N); calls += 1
    return total, calls

def shut(B, info, accs, pooled): return 0
def oracle(B, info, accs, pooled):
    best, bw = 1 / cost(B, 1), 0
    for w in range(1, 11):
        tok = min(min(ell, avail, w) + 1 for (bucket, avail, ell) in info.values())
        r = tok / cost(B, w + 1)
        if r > best: best, bw = r, w
    return bw
def eg(source):
    def pol(B, info, accs, pooled):
        best, bw = 1 / cost(B, 1), 0
        for w in range(1, 11):
            e = 1.0
            for k in range(1, w + 1):
                p = 1.0
                for b, (bucket, avail, ell) in info.items():
                    a = (pooled if source == "pooled" else accs[b]).est(bucket)
                    p *= a ** k if k <= avail else 0.0
                e += p
            r = e / cost(B, w + 1)
            if r > best: best, bw = r, w
        return bw
    return pol
def openw(w):
    return lambda B, info, accs, pooled: w

if __name__ == "__main__":
    print("cost table (ms):")
    for B in (4, 3, 2, 1):
        print(B, {n: round(tab[(B, n)], 2) for n in range(1, 12) if (B, n) in tab}, "n:", {n: len(groups[(B, n)]) for n in range(1, 12) if (B, n) in groups})
    pols = {"shut": shut, "oracle": oracle, "eg-row": eg("row"), "eg-pooled": eg("pooled"), "open4": openw(4), "open10": openw(10)}
    res = defaultdict(list)
    for i, rows in sorted(rows_by_batch.items()):
        BATCH[0] = i
        line = [f"batch {i}"]
        for name, p in pols.items():
            tt, calls = simulate(rows, p)
            res[name].append(tt); line.append(f"{name} {tt:.2f}s/{calls}")
        m = next(x for x in data["times"] if x["batch"] == i)
        line.append("measured: pk %.2f shut %.2f open %.2f default %.2f" % (m["pk"], m["shut"], m["open"], m["default"]))
        print(" | ".join(line))
    pk = [x["pk"] for x in sorted(data["times"], key=lambda x: x["batch"])]
    for name in pols:
        print(f"{name:10s} sim vs pk geomean {statistics.geometric_mean([a / b for a, b in zip(pk, res[name])]):.3f}")
    for mode in ("shut", "open", "default"):
        ms = [x[mode] for x in sorted(data["times"], key=lambda x: x["batch"])]
        print(f"measured {mode:8s} vs pk geomean {statistics.geometric_mean([a / b for a, b in zip(pk, ms)]):.3f}")

# --- the implemented rule: per-row estimates, online cost model per row count with a prior -------------
from hf_cascade.drafters.lookahead import CostModel
def simulate_online(rows, prior_slope_per_row=None, prior_step=0.6):
    t = [0] * len(rows); total = PREFILL[BATCH[0]]; calls = 0
    accs = [Acc() for _ in rows]; costs = {}
    while True:
        active = [b for b in range(len(rows)) if t[b] < rows[b]["G"]]
        if not active: break
        B = len(active)
        cm = costs.setdefault(B, CostModel(prior_step=prior_step, prior_slope=0.05 if prior_slope_per_row is None else prior_slope_per_row * B))
        most = min(t[b] for b in active)
        lag = [b for b in active if t[b] == most]
        reaches = []
        for b in lag:
            bucket, avail, ell = rows[b]["cands"][t[b]]
            avail = min(avail, rows[b]["G"] - t[b] - 1)
            a = accs[b].est(bucket)
            reaches.append([a ** k for k in range(1, avail + 1)])
        best_w, best, e = 0, 1.0, 1.0
        for k in range(1, max((len(r) for r in reaches), default=0) + 1):
            j = 1.0
            for r in reaches: j *= r[k - 1] if k <= len(r) else 0.0
            if j <= 0: break
            e += j; v = e / cm.cost(k)
            if v > best: best_w, best = k, v
        N = 1
        for b in active:
            if b in lag and best_w > 0:
                bucket, avail, ell = rows[b]["cands"][t[b]]; k = min(avail, best_w, rows[b]["G"] - t[b] - 1)
                if k > 0:
                    N = max(N, k + 1); acc = min(ell, k); accs[b].obs(bucket, k, acc); t[b] += acc + 1; continue
            t[b] += 1
        c = cost(B, N); total += c; calls += 1
        cm.observe(N - 1, c)
    return total, calls

if __name__ == "__main__":
    pk = [x["pk"] for x in sorted(data["times"], key=lambda x: x["batch"])]
    for label, kw in [("online slope .05", {}), ("online slope .05B", {"prior_slope_per_row": 0.05}),
                      ("online slope .1B", {"prior_slope_per_row": 0.1}), ("online .05B step .4", {"prior_slope_per_row": 0.05, "prior_step": 0.4})]:
        tt = []
        for i, rows in sorted(rows_by_batch.items()):
            BATCH[0] = i; tt.append(simulate_online(rows, **kw)[0])
        print(f"{label:22s} sim vs pk geomean {statistics.geometric_mean([a / b for a, b in zip(pk, tt)]):.3f}")
