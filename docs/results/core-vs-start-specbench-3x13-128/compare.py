"""Paired comparison of two bench runs of the same prompts (e.g. the issue's starting commit and the core).

    python compare.py BASE/results.json NEW/results.json [REFERENCE]     (REFERENCE: plain-kernels)

For every method in both runs: the total-time speed ratio REFERENCE/method in each run, and, per prompt, the
new run's REFERENCE/method time ratio over the base run's, summarised as a geometric mean with a 95%
bootstrap interval over prompts (1.0: the method kept its speed relative to the reference).
"""
import json, sys, random, math
def load(p):
    d = json.load(open(p))
    t = {}
    for r in d["records"]:
        t[(r["method"], r["prompt_index"])] = r["seconds"]
    return t
base, new = load(sys.argv[1]), load(sys.argv[2])
ref = sys.argv[3] if len(sys.argv) > 3 else "plain-kernels"
methods = sorted({m for m, _ in base} & {m for m, _ in new})
prompts = sorted({i for _, i in base})
print(f"| method | base: total time ratio {ref}/method | new | new/base of per-prompt ratios (geo-mean) | 95% interval |")
print("|---|---:|---:|---:|---:|")
random.seed(0)
for m in methods:
    if m == ref: continue
    tb = sum(base[ref, i] for i in prompts) / sum(base[m, i] for i in prompts)
    tn = sum(new[ref, i] for i in prompts) / sum(new[m, i] for i in prompts)
    logs = [math.log((new[ref, i] / new[m, i]) / (base[ref, i] / base[m, i])) for i in prompts]
    g = math.exp(sum(logs) / len(logs))
    boots = []
    for _ in range(4000):
        s = [random.choice(logs) for _ in logs]
        boots.append(math.exp(sum(s) / len(s)))
    boots.sort()
    print(f"| {m} | {tb:.3f} | {tn:.3f} | {g:.3f} | {boots[100]:.3f}-{boots[3899]:.3f} |")
