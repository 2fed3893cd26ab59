"""In-process A/B of the batch draft gate at B=4: default vs variants; outputs checked identical."""
import sys, time, torch, statistics
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import gate as G
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
prompts = load_prompts(None, 3)
batches = make_batches(tok, prompts, 4)
sel = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(range(len(batches)))
variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["default", "open"]
orig_allows = G.DraftGate.allows
log = {}
class Counting:
    pass
import oldgate
from hf_cascade.core import batch_state
NewGate = batch_state.DraftGate
class OldGate(oldgate.DraftGate):
    def allows(self, lagging=()):
        return super().allows()
    def observe(self, drafted, emitted, seconds, widest=0):
        return super().observe(drafted, min(emitted.values()) if emitted else 0, seconds, widest)
def run(v, b):
    batch_state.DraftGate = OldGate if v == "old" else NewGate
    if v == "open":
        G.DraftGate.allows = lambda self, lagging=(): True
    else:
        G.DraftGate.allows = orig_allows
    a = CascadeAssistant([MaxGram()])
    t = time.perf_counter()
    out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False,
                         max_new_tokens=128, pad_token_id=0)
    dt = time.perf_counter() - t
    G.DraftGate.allows = orig_allows
    return out, dt, a.last_stats.to_dict()["target_calls"] if hasattr(a.last_stats, "to_dict") else None
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        out = model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=128, pad_token_id=0)
        return out, time.perf_counter() - t
pk(batches[0]); run("new", batches[0])
res = {v: [] for v in variants}
for i in sel:
    b = batches[i]
    ref, tpk = pk(b)
    line = [f"batch {i} pk {tpk:.1f}s"]
    for v in (variants if i % 2 == 0 else variants[::-1]):
        out, dt, calls = run(v, b)
        same = torch.equal(out if isinstance(out, torch.Tensor) else out.sequences, ref)
        res[v].append(tpk / dt)
        line.append(f"{v} {dt:.1f}s x{tpk/dt:.2f} calls {calls} {'ok' if same else 'DIFF'}")
    print(" | ".join(line), flush=True)
for v in variants:
    print(v, "geomean vs pk", round(statistics.geometric_mean(res[v]), 3))
