import sys, time, torch, statistics
from collections import defaultdict
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import batch as B, rows as R
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
batches = make_batches(tok, load_prompts(None, 3), 4)
rec = defaultdict(lambda: defaultdict(list))
dec = model.get_decoder()
cur = {}
of = dec.forward
def fwd(*a, **k):
    t = time.perf_counter(); r = of(*a, **k); cur["body"] = time.perf_counter() - t; return r
dec.forward = fwd
ofb = B.first_blocks
def fb(*a, **k):
    t = time.perf_counter(); r = ofb(*a, **k); cur["head"] = time.perf_counter() - t; return r
B.first_blocks = fb
om = None
ov = B.verify
def verify(run, drafts):
    global om
    if om is None:
        om = run.mask.__func__ if hasattr(run.mask, "__func__") else None
    t = time.perf_counter(); r = ov(run, drafts)
    N = max(t_.num_nodes for t_, _ in drafts) + 1
    key = (len(run.rows), "N1" if N == 1 else "N>1")
    rec[key]["all"].append(time.perf_counter() - t)
    for k, v in cur.items(): rec[key][k].append(v)
    return r
B.verify = verify
for rep in range(2):
  for i in [int(x) for x in sys.argv[1].split(",")]:
    b = batches[i]; rec.clear()
    a = CascadeAssistant([MaxGram()])
    out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
    if rep: print("batch", i, {k: {p: (len(v), round(1000 * statistics.median(v))) for p, v in d.items()} for k, d in rec.items()}, flush=True)
