"""A/B in one process at B rows: the cascade (shipped drafter + Max-Gram, the bench's method) where the gate idles
its drafters' forwards (DraftGate.sized_to): rows draft from Max-Gram alone at the idle steps ("lookups", this
commit) or draft nothing there ("none", before: DraftGate.idling held False); plain-kernels interleaved; outputs
checked. Usage: lookups_ab.py BATCHES|all ROWS"""
import sys, time, torch, statistics
import hf_cascade
from hf_cascade.core.gate import DraftGate
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts, load_drafts, shipped_head, SHIPPED_HEADS
from hf_cascade.bench.batched import make_batches
from hf_cascade.bench.methods import build_method
torch.set_num_threads(2)
model, tok = load_default_target()
bs = int(sys.argv[2])
batches = make_batches(tok, load_prompts(None, 3), bs)
sel = [int(x) for x in sys.argv[1].split(",")] if sys.argv[1] != "all" else range(len(batches))
method = build_method("cascade", model, load_drafts([shipped_head(f) for f in SHIPPED_HEADS["cascade"]], model))
idling = DraftGate.idling
kw = dict(do_sample=False, max_new_tokens=128, pad_token_id=0)
def run(v, b):
    DraftGate.idling = idling if v == "lookups" else property(lambda self: False)
    t = time.perf_counter()
    out, _ = method.run(b.input_ids, b.attention_mask, kw)
    return out, time.perf_counter() - t
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        out = model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
        return out, time.perf_counter() - t
pk(batches[0]); run("lookups", batches[0]); run("none", batches[0])
res = {"lookups": [], "none": []}
for i in sel:
    b = batches[i]; ref, tpk = pk(b)
    line = [f"batch {i} pk {tpk:.2f}s"]
    for v in (["lookups", "none"] if i % 2 == 0 else ["none", "lookups"]):
        out, dt = run(v, b)
        res[v].append(tpk / dt)
        line.append(f"{v} {dt:.2f}s x{tpk/dt:.2f} {'ok' if torch.equal(out.cpu(), ref) else 'DIFF'}")
    print(" | ".join(line), flush=True)
for v in res: print(v, "geomean vs pk", round(statistics.geometric_mean(res[v]), 3))
r = [a / b for a, b in zip(res["lookups"], res["none"])]
print("lookups/none geomean", round(statistics.geometric_mean(r), 3), "per batch", [round(x, 2) for x in r])
