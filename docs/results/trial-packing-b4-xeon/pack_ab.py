"""In-process A/B at B rows: our batched loop with packing of the real queries vs without; plain-kernels as reference.
NAMES env: comma list from maxgram, maxgram-nopack, maxgram-open, maxgram-open-nopack, loop-off."""
import sys, time, os, torch
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.bench.batched import make_batches
from hf_cascade.bench.config import BenchConfig
from hf_cascade.bench.runner import generation_kwargs, rotated
from hf_cascade.backends.cpu import cpu_kernels
from hf_cascade.core.gate import DraftGate
from hf_cascade.core.batch_state import BatchRun
torch.set_num_threads(2)
size = int(sys.argv[1]) if len(sys.argv) > 1 else 4
per_cat = int(sys.argv[2]) if len(sys.argv) > 2 else 2
model, tok = load_model(None)
batches = make_batches(tok, load_prompts(None, per_cat), size)
kw = generation_kwargs(BenchConfig(), tok)
allows = DraftGate.allows
def run(name, b):
    if name == "plain-kernels":
        with cpu_kernels(model):
            return model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
    DraftGate.allows = (lambda self: False) if name.endswith("off") else (lambda self: True) if "-open" in name else allows
    BatchRun.pack_queries = "nopack" not in name
    DraftGate.follows_lagging = "-all" not in name
    try:
        return model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=assist[name], **kw)
    finally:
        DraftGate.allows = allows
        BatchRun.pack_queries = True
        DraftGate.follows_lagging = True
assist = {n: CascadeAssistant([MaxGram()]) for n in os.environ.get("NAMES", "maxgram,maxgram-nopack").split(",")}
names = ["plain-kernels", *assist]
for n in names: run(n, batches[0])
res = {n: [] for n in names}
for i, b in enumerate(batches):
    outs = {}
    for n in rotated(names, i):
        t = time.perf_counter(); outs[n] = run(n, b); res[n].append(time.perf_counter() - t)
    same = all(outs[n].tolist() == outs["plain-kernels"].tolist() for n in names)
    print(i, {n: round(res["plain-kernels"][-1] / res[n][-1], 3) for n in names}, same, flush=True)
print("total", {n: round(sum(res["plain-kernels"]) / sum(res[n]), 3) for n in names})
