import sys, time, torch, statistics
from collections import defaultdict
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import batch as B
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(2)
model, tok = load_default_target()
batches = make_batches(tok, load_prompts(None, 3), 4)
agg = {True: defaultdict(float), False: defaultdict(float)}; n = {True: 0, False: 0}
ov = B.verify
on = [False]
def verify(run, drafts):
    N = max(t.num_nodes for t, _ in drafts) + 1
    if not on[0] or (N == 1 and n[False] >= 20): return ov(run, drafts)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        r = ov(run, drafts)
    for e in p.key_averages():
        agg[N > 1][e.key] += e.self_cpu_time_total / 1000
    n[N > 1] += 1
    return r
B.verify = verify
i = int(sys.argv[1])
for rep in range(2):
    on[0] = rep == 1
    a = CascadeAssistant([MaxGram()])
    model.generate(batches[i].input_ids, attention_mask=batches[i].attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
for k in (False, True):
    print("N>1" if k else "N=1", n[k], "calls; self ms per call, top:")
    for key, v in sorted(agg[k].items(), key=lambda x: -x[1])[:14]:
        print(f"   {v / max(n[k],1):8.2f}  {key}")
