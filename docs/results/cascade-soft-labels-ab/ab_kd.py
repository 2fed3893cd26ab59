"""A/B: Max-Gram alone vs cascade [drafter, MaxGram] for several drafters, interleaved.

usage: python ab_kd.py TAKE DRAFTER [DRAFTER ...]   Spec-Bench prompts FIRST .. FIRST+TAKE-1 of each category
(environment variable FIRST, default 3: none of the benchmark's first 3). Paired ratios as in `hf-cascade bench`
(hf_cascade.bench.summary.paired; the logs here were written by an earlier copy of this script whose bootstrap
drew with numpy: same method, other random draws, so an interval may differ in its third decimal)."""
import os, sys, time, json
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.bench import summary
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.bench.runner import encode, rotated
take = int(sys.argv[1]); paths = sys.argv[2:]; first = int(os.environ.get("FIRST", 3))
model, tok = load_model(None)
drafts = load_drafts(paths, model)
items = load_prompts(None, first + take)
bycat = {}
for it in items:
    bycat.setdefault(it["category"], []).append(it)
prompts = [it for v in bycat.values() for it in v[first:first + take]]
K = [[3, 10], [0, 10]]
A = {"maxgram": CascadeAssistant([MaxGram()])}
for p, d in zip(paths, drafts):
    A[p.rstrip("/").split("/")[-1]] = CascadeAssistant([d, MaxGram()], k_matrix=K, maxgram_first=True, cost_aware=True)
names = list(A)
gk = dict(do_sample=False, max_new_tokens=128)
ids0 = tok("Question: Hello\n\nAnswer:", return_tensors="pt")
for n in names:
    model.generate(**ids0, assistant_model=A[n], do_sample=False, max_new_tokens=32)
res = {n: [] for n in names}; tpc = {n: [] for n in names}; same = 0
for i, it in enumerate(prompts):
    ids, mask = encode(tok, it)                                  # [1, L] each
    outs = {}
    for n in rotated(names, i):                                  # the bench's interleaving
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, assistant_model=A[n], **gk)
        res[n].append(time.perf_counter() - t0)
        tpc[n].append((out.shape[1] - ids.shape[1]) / max(1, A[n].last_stats.target_calls))
        outs[n] = out[0].tolist()
    same += len({tuple(v) for v in outs.values()}) == 1
    print(i, it["category"], {n: round(res[n][-1], 2) for n in names}, {n: round(tpc[n][-1], 2) for n in names}, flush=True)
records = [{"prompt_index": i, "method": n, "seconds": t} for n in names for i, t in enumerate(res[n])]
def paired(a, b):
    p = summary.paired(records, a, b)
    return round(p["ratio"], 3), round(p["low"], 3), round(p["high"], 3), p["faster_on"]
print("identical across arms:", same, "/", len(prompts))
print("tok/call", {n: round(float(np.mean(tpc[n])), 2) for n in names})
for n in names[1:]:
    print("maxgram/" + n, paired("maxgram", n))
for i in range(1, len(names)):
    for j in range(i + 1, len(names)):
        print(names[i] + "/" + names[j], paired(names[i], names[j]))
