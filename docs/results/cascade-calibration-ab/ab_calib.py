"""A/B, interleaved in one process, Spec-Bench prompts 4-5 of each category, 128 tokens, greedy.

    python ab_calib.py RETRAINED_DRAFTER SHIPPED_DRAFTER calibration   # ab.log: calibration on/off, two drafters
    python ab_calib.py RETRAINED_DRAFTER SHIPPED_DRAFTER budget        # ab_k.log: the drafter's K row 0 = 2, 3, 6
"""
import sys, time
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.bench.loading import load_model, load_drafts, load_prompts
from hf_cascade.drafters.lookahead import AcceptanceCalibration
import hf_cascade.cascade.generator as G

class Off(AcceptanceCalibration):
    def observe(self, p, accepted):
        pass

draft_path, old_path, experiment = sys.argv[1], sys.argv[2], sys.argv[3]
per_cat, take = 5, 2
model, tok = load_model(None)
draft, old = load_drafts([draft_path, old_path], model)
items = load_prompts(None, per_cat)
bycat = {}
for it in items:
    bycat.setdefault(it["category"], []).append(it)
prompts = [it for v in bycat.values() for it in v[-take:]]
def cascade(drafter, k0=3):
    return CascadeAssistant([drafter, MaxGram()], k_matrix=[[k0, 10], [0, 10]], maxgram_first=True, cost_aware=True)
def arms():
    if experiment == "budget":
        return {"maxgram": (CascadeAssistant([MaxGram()]), None), "cs-k6": (cascade(old, 6), AcceptanceCalibration),
                "cs-k2": (cascade(old, 2), AcceptanceCalibration), "old-cal": (cascade(old), AcceptanceCalibration)}
    return {"maxgram": (CascadeAssistant([MaxGram()]), None), "cs-raw": (cascade(draft), Off),
            "cs-cal": (cascade(draft), AcceptanceCalibration), "old-cal": (cascade(old), AcceptanceCalibration)}
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
pairs = [("maxgram", "old-cal"), ("cs-k6", "old-cal"), ("cs-k2", "old-cal"), ("maxgram", "cs-k6")] if experiment == "budget" \
    else [("maxgram", "cs-cal"), ("maxgram", "cs-raw"), ("cs-raw", "cs-cal"), ("old-cal", "cs-cal"), ("maxgram", "old-cal")]
for a, b in pairs:
    print(f"{a}/{b}", paired(a, b))
