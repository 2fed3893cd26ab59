"""A/B in one process, plain-kernels interleaved, every output checked against it. Usage: ride_ab.py BATCHES|all
[ROWS] [MODE]. MODE "ride" (default; ride_ab*.log): rows ahead ride along in the padded width (DraftGate.ride_share
0.05) or not (0). MODE "cache" (cache_ab*.log; arms printed as ride = the tried cache, noride = DynamicCache): the
batch loop's cache appends in place (kvcache_tried.py) or is transformers' DynamicCache."""
import sys, time, torch, statistics
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
import os
from transformers import DynamicCache
from hf_cascade.core import batch_state
from hf_cascade.core.gate import DraftGate
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvcache_tried import growing_cache
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
bs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
CACHE = len(sys.argv) > 3 and sys.argv[3] == "cache"
batches = make_batches(tok, load_prompts(None, 3), bs)
sel = [int(x) for x in sys.argv[1].split(",")] if sys.argv[1] != "all" else range(len(batches))
def run(v, b):
    if CACHE:
        batch_state.DynamicCache = growing_cache if v == "ride" else DynamicCache   # the loop's cache (row_cache: GLIDE only)
    else:
        DraftGate.ride_share = 0.05 if v == "ride" else 0.0
    a = CascadeAssistant([MaxGram()])
    t = time.perf_counter()
    out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
    return out, time.perf_counter() - t, a.last_stats.target_calls
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        out = model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=128, pad_token_id=0)
        return out, time.perf_counter() - t
for b in batches: pk(b)        # every batch's shapes once (the kernels' tuner), before timing
run("ride", batches[0]); run("noride", batches[0])
res = {"ride": [], "noride": []}
for i in sel:
    b = batches[i]; ref, tpk = pk(b)
    line = [f"batch {i} pk {tpk:.2f}s"]
    for v in (["ride", "noride"] if i % 2 == 0 else ["noride", "ride"]):
        out, dt, calls = run(v, b)
        res[v].append(tpk / dt)
        line.append(f"{v} {dt:.2f}s x{tpk/dt:.2f} calls {calls} {'ok' if torch.equal(out, ref) else 'DIFF'}")
    print(" | ".join(line), flush=True)
for v in res: print(v, "geomean vs pk", round(statistics.geometric_mean(res[v]), 3))
r = [a / b for a, b in zip(res["ride"], res["noride"])]
print("ride/noride geomean", round(statistics.geometric_mean(r), 3), "per batch", [round(x, 2) for x in r])
