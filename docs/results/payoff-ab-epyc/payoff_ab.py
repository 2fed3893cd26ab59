"""A/B in one process, one row at a time: the cascade (shipped drafter + Max-Gram, defaults) with the drafter's
payoff rule (DrafterPayoff, this change: "payoff") and without it ("always": worth() held True, as before), beside
Max-Gram alone, interleaved prompt by prompt in rotating order; outputs checked against plain-kernels greedy.
Prompts: Spec-Bench's 4th and 5th of each category (not the bench's first 3). Usage: payoff_ab.py [FIRST LAST]"""
import sys, time, statistics, random, torch
import hf_cascade
from hf_cascade.drafters.lookahead import DrafterPayoff
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts, load_drafts, shipped_head, SHIPPED_HEADS
from hf_cascade.bench.methods import build_method
torch.set_num_threads(2)
model, tok = load_default_target()
first, last = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (3, 5)
items = load_prompts(None, last)
by = {}
for it in items:
    by.setdefault(it["category"], []).append(it)
prompts = [p for c in sorted(by) for p in by[c][first:last]]
cascade = build_method("cascade", model, load_drafts([shipped_head(f) for f in SHIPPED_HEADS["cascade"]], model))
maxgram = build_method("maxgram", model, [])
worth = DrafterPayoff.worth
kw = dict(do_sample=False, max_new_tokens=128)
def run(arm, ids):
    DrafterPayoff.worth = worth if arm == "payoff" else (lambda self, reach: True)
    m = maxgram if arm == "maxgram" else cascade
    t = time.perf_counter(); out, stats = m.run(ids, torch.ones_like(ids), kw); dt = time.perf_counter() - t
    fwd = stats["levels"][0]["forward_calls"] if arm != "maxgram" and stats else 0
    return out, dt, fwd, (stats or {}).get("target_calls", 0)
arms = ["maxgram", "payoff", "always"]
w = tok(prompts[0]["prompt"], return_tensors="pt").input_ids
for a in arms: run(a, w)
with hf_cascade.cpu_kernels(model): model.generate(w, **kw)
T = {a: [] for a in arms}; F = {a: [0, 0] for a in arms}
for i, p in enumerate(prompts):
    ids = tok(p["prompt"], return_tensors="pt").input_ids
    with hf_cascade.cpu_kernels(model):
        ref = model.generate(ids, **kw)
    order = arms[i % 3:] + arms[:i % 3]
    line = [f"{i:2d} {p['category'][:12]:12s}"]
    for a in order:
        out, dt, fwd, calls = run(a, ids)
        n = out.shape[-1] - ids.shape[-1]
        T[a].append(dt / n); F[a][0] += fwd; F[a][1] += calls
        line.append(f"{a} {dt:.2f}s{'' if torch.equal(out, ref) else ' DIFF'} f{fwd}/c{calls}")
    print(" | ".join(line), flush=True)
def paired(x, y, B=2000):
    r = [a / b for a, b in zip(x, y)]; g = statistics.geometric_mean(r)
    rnd = random.Random(0); bs = sorted(statistics.geometric_mean([r[rnd.randrange(len(r))] for _ in r]) for _ in range(B))
    return f"{g:.3f} ({bs[int(.025*B)]:.3f}-{bs[int(.975*B)]:.3f})"
print("time per token, maxgram/payoff", paired(T["maxgram"], T["payoff"]))
print("time per token, maxgram/always", paired(T["maxgram"], T["always"]))
print("time per token, always/payoff ", paired(T["always"], T["payoff"]))
for a in arms: print(a, "drafter forwards / target calls", F[a])
