"""A/B in one process at B rows: the cascade (shipped drafter + Max-Gram, the bench's method) with the gate idling
after costly drafts cut to nothing (DraftGate.sized_to, c3d095c+) or not; plain-kernels interleaved; outputs
checked. Usage: idle_ab.py BATCHES|all ROWS [STRATEGY]"""
import sys, time, torch, statistics
import hf_cascade
from hf_cascade.core.gate import DraftGate
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts, load_drafts, shipped_head, SHIPPED_HEADS
from hf_cascade.bench.batched import make_batches
from hf_cascade.bench.methods import build_method
torch.set_num_threads(2)
model, tok = load_default_target()
bs = int(sys.argv[2]); name = sys.argv[3] if len(sys.argv) > 3 else "cascade"
batches = make_batches(tok, load_prompts(None, 3), bs)
sel = [int(x) for x in sys.argv[1].split(",")] if sys.argv[1] != "all" else range(len(batches))
fam = {"cascade": "cascade", "hsddw": "hsddw"}.get(name)
drafts = load_drafts([shipped_head(f) for f in SHIPPED_HEADS[fam]], model) if fam else []
method = build_method(name, model, drafts)
sized_to = DraftGate.sized_to
kw = dict(do_sample=False, max_new_tokens=128, pad_token_id=0)
def run(v, b):
    DraftGate.sized_to = sized_to if v == "idle" else (lambda self, w, s: None)
    t = time.perf_counter()
    out, _ = method.run(b.input_ids, b.attention_mask, kw)
    return out, time.perf_counter() - t
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        out = model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
        return out, time.perf_counter() - t
pk(batches[0]); run("idle", batches[0]); run("old", batches[0])
res = {"idle": [], "old": []}
for i in sel:
    b = batches[i]; ref, tpk = pk(b)
    line = [f"batch {i} pk {tpk:.2f}s"]
    for v in (["idle", "old"] if i % 2 == 0 else ["old", "idle"]):
        out, dt = run(v, b)
        res[v].append(tpk / dt)
        line.append(f"{v} {dt:.2f}s x{tpk/dt:.2f} {'ok' if torch.equal(out.cpu(), ref) else 'DIFF'}")
    print(" | ".join(line), flush=True)
for v in res: print(v, "geomean vs pk", round(statistics.geometric_mean(res[v]), 3))
r = [a / b for a, b in zip(res["idle"], res["old"])]
print("idle/old geomean", round(statistics.geometric_mean(r), 3), "per batch", [round(x, 2) for x in r])
