"""A/B: cost-aware cascade with and without the acceptance calibration, plus Max-Gram, interleaved."""
import sys, time, random, json
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.drafters.lookahead import AcceptanceCalibration
import hf_cascade.cascade.generator as G

class Off(AcceptanceCalibration):
    def observe(self, p, accepted):
        pass

draft_path, old_path = sys.argv[1], sys.argv[2]
per_cat, take = 5, 2
model, tok = load_model(None)
draft, old = load_drafts([draft_path, old_path], model)
items = load_prompts(None, per_cat)
bycat = {}
for it in items:
    bycat.setdefault(it["category"], []).append(it)
prompts = [it for v in bycat.values() for it in v[-take:]]
K = [[3, 10], [0, 10]]
def arms():
    return {
        "maxgram": (CascadeAssistant([MaxGram()]), None),
        "cs-k6": (CascadeAssistant([old, MaxGram()], k_matrix=[[6, 10], [0, 10]], maxgram_first=True, cost_aware=True), AcceptanceCalibration),
        "cs-k2": (CascadeAssistant([old, MaxGram()], k_matrix=[[2, 10], [0, 10]], maxgram_first=True, cost_aware=True), AcceptanceCalibration),
        "old-cal": (CascadeAssistant([old, MaxGram()], k_matrix=K, maxgram_first=True, cost_aware=True), AcceptanceCalibration),
    }
A = arms()
names = list(A)
gk = dict(do_sample=False, max_new_tokens=128)
ids0 = tok("Question: Hello\n\nAnswer:", return_tensors="pt")
for n in names:                                   # warm up (kernels, tuner)
    G.AcceptanceCalibration = A[n][1] or AcceptanceCalibration
    model.generate(**ids0, assistant_model=A[n][0], do_sample=False, max_new_tokens=32)
res = {n: [] for n in names}; tpc = {n: [] for n in names}; same = 0
for i, it in enumerate(prompts):
    enc = tok(it["prompt"], return_tensors="pt")
    order = names[i % len(names):] + names[:i % len(names)]
    outs = {}
    for n in order:
        G.AcceptanceCalibration = A[n][1] or AcceptanceCalibration
        t0 = time.perf_counter()
        out = model.generate(**enc, assistant_model=A[n][0], **gk)
        res[n].append(time.perf_counter() - t0)
        st = A[n][0].last_stats
        tpc[n].append((out.shape[1] - enc["input_ids"].shape[1]) / max(1, st.target_calls))
        outs[n] = out[0].tolist()
    same += len({tuple(v) for v in outs.values()}) == 1
    print(i, it["category"], {n: round(res[n][-1], 2) for n in names}, {n: round(tpc[n][-1], 2) for n in names}, flush=True)
def paired(a, b):
    a, b = np.array(res[a]), np.array(res[b]); r = []
    rng = np.random.default_rng(0)
    for _ in range(2000):
        ix = rng.integers(0, len(a), len(a)); r.append(a[ix].sum() / b[ix].sum())
    return round(a.sum() / b.sum(), 3), round(float(np.percentile(r, 2.5)), 3), round(float(np.percentile(r, 97.5)), 3), int((b < a).sum())
print("identical across arms:", same, "/", len(prompts))
print("tok/call", {n: round(float(np.mean(tpc[n])), 2) for n in names})
print("maxgram/old-cal", paired("maxgram", "old-cal"))
print("cs-k6/old-cal", paired("cs-k6", "old-cal"))
print("cs-k2/old-cal", paired("cs-k2", "old-cal"))
print("maxgram/cs-k6", paired("maxgram", "cs-k6"))
