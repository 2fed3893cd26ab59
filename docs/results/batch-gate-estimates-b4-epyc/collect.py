"""Collect for the B=4 gate simulator: each row's greedy output (plain-kernels batched generate) and the real
loop's step times by (active rows, padded width), with the gate held open and held shut."""
import sys, time, json, torch
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import gate as G, batch as BT
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
prompts = load_prompts(None, 3)
batches = make_batches(tok, prompts, 4)
steps = []
cur = {"batch": -1}
orig_verify = BT.verify
def verify(run, drafts):
    cur["B"] = len(run.rows); cur["N"] = max(t.num_nodes for t, _ in drafts) + 1
    cur["cache"] = int(run.past_pos.shape[1])
    return orig_verify(run, drafts)
BT.verify = verify
orig_observe = G.DraftGate.observe
def observe(self, drafted, tokens, seconds, widest=0):
    steps.append(dict(batch=cur["batch"], mode=cur["mode"], B=cur["B"], N=cur["N"], cache=cur["cache"], s=seconds, tokens=tokens))
    return orig_observe(self, drafted, tokens, seconds, widest)
G.DraftGate.observe = observe
orig_allows = G.DraftGate.allows
out = {"rows": [], "steps": steps}
def run(mode, b):
    cur["mode"] = mode
    G.DraftGate.allows = (lambda self: True) if mode == "open" else (lambda self: False) if mode == "shut" else orig_allows
    a = CascadeAssistant([MaxGram()])
    t = time.perf_counter()
    o = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
    return o, time.perf_counter() - t
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        o = model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=128, pad_token_id=0)
        return o, time.perf_counter() - t
pk(batches[0]); run("default", batches[0]); steps.clear()
times = []
for i, b in enumerate(batches):
    cur["batch"] = i
    ref, tpk = pk(b)
    P = b.input_ids.shape[1]
    for r in range(ref.shape[0]):
        prompt = b.input_ids[r][b.attention_mask[r].bool()].tolist()
        gen = ref[r, P:].tolist()
        if 1 in gen: gen = gen[: gen.index(1) + 1]
        out["rows"].append(dict(batch=i, prompt=prompt, gen=gen))
    line = {"batch": i, "pk": tpk}
    for mode in (["open", "shut", "default"] if i % 2 == 0 else ["default", "shut", "open"]):
        o, dt = run(mode, b)
        assert torch.equal(o, ref), (i, mode)
        line[mode] = dt
    times.append(line)
    print(line, flush=True)
out["times"] = times
json.dump(out, open("/work/prof/s47/collect.json", "w"))
