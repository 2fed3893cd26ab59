"""A/B: Max-Gram alone vs cascade [drafter, MaxGram] for several drafters, interleaved.

usage: python ab_kd.py TAKE DRAFTER [DRAFTER ...]   Spec-Bench prompts FIRST .. FIRST+TAKE-1 of each category
(environment variable FIRST, default 3: none of the benchmark's first 3). Interleaving as in `hf-cascade bench`
(hf_cascade.bench.runner.compare_assistants), paired ratios too (hf_cascade.bench.summary.paired). The logs here
were written by earlier copies of this script with the same loop inline (their bootstrap drew with numpy: same
method, other random draws, so an interval may differ in its third decimal)."""
import os, sys
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.bench import summary
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.bench.runner import compare_assistants
take = int(sys.argv[1]); paths = sys.argv[2:]; first = int(os.environ.get("FIRST", 3))
model, tok = load_model(None)
drafts = load_drafts(paths, model)
bycat = {}
for it in load_prompts(None, first + take):
    bycat.setdefault(it["category"], []).append(it)
prompts = [it for v in bycat.values() for it in v[first:first + take]]
A = {"maxgram": CascadeAssistant([MaxGram()])}
for p, d in zip(paths, drafts):
    A[p.rstrip("/").split("/")[-1]] = CascadeAssistant([d, MaxGram()], k_matrix=[[3, 10], [0, 10]], maxgram_first=True,
                                                        cost_aware=True)
names = list(A)
records, same = compare_assistants(model, tok, prompts, A)
for r in records:
    print(r["prompt_index"], r["category"], r["method"], round(r["seconds"], 2), round(r["tokens_per_call"], 2))
print("identical across arms:", same, "/", len(prompts))
print("tok/call", {n: round(float(np.mean([r["tokens_per_call"] for r in records if r["method"] == n])), 2) for n in names})
for i in range(len(names)):
    for j in range(i + 1, len(names)):
        p = summary.paired(records, names[i], names[j])
        print(f"{names[i]}/{names[j]}", round(p["ratio"], 3), round(p["low"], 3), round(p["high"], 3), p["faster_on"])
