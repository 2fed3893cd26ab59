"""Resample the recorded rounds (rounds.jsonl: 6 processes x 6 symmetric rounds) into profiles made of one round
(4adc1f8's default) or the median of k rounds from k different processes (the kept rounds); print the spread."""

import json
import random
import statistics
import sys

from hf_cascade.measure import monotone_profile

procs = [
    [{int(k): v for k, v in r.items()} for r in json.loads(l)["rounds"]]
    for l in open(sys.argv[1] if len(sys.argv) > 1 else "rounds.jsonl")
]
print(len(procs), "processes,", sum(map(len, procs)), "rounds")
random.seed(0)
for k in (1, 3, 5):
    outs = []
    for _ in range(4000):
        ps = random.sample(procs, k) if k <= len(procs) else [random.choice(procs) for _ in range(k)]
        rs = [random.choice(p) for p in ps]
        outs.append(monotone_profile({n: statistics.median(r[n] for r in rs) for n in rs[0]}))
    print(
        f"median of {k} rounds of {k} processes | "
        + " | ".join(
            f"cost({n}) sd {statistics.pstdev([o[n] for o in outs]):.3f}, "
            f"5-95% {statistics.quantiles([o[n] for o in outs], n=20)[0]:.2f}-"
            f"{statistics.quantiles([o[n] for o in outs], n=20)[-1]:.2f}"
            for n in (1, 8, 24)
        )
    )
