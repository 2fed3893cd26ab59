import sys, time, torch, statistics, json
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import batch as B
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
batches = make_batches(tok, load_prompts(None, 3), 4)
log = []
orig_sized, orig_observe = B.sized, None
def sized(run, drafts, drafting):
    pre = [d[0].num_nodes for d in drafts]
    reaches = [run.rows[b].drafter.reach(drafts[b][0]) for b in sorted(drafting)]
    out = orig_sized(run, drafts, drafting)
    g = run.gate
    c = g.costs.get(len(run.rows))
    log.append(dict(rows=len(run.rows), drafting=sorted(drafting), pre=pre, post=[d[0].num_nodes for d in out],
                    reach=[[round(x, 2) for x in (r or [])][:6] for r in reaches],
                    cost={k: round(c.cost(k), 2) for k in range(0, 5)} if c else None, sec={k: round(v*1000) for k, v in c._seconds.items()} if c else None, est=g.estimated))
    return out
B.sized = sized
for i in [int(x) for x in sys.argv[1].split(",")] * 2:
    b = batches[i]; log.clear()
    print("batch", i, "lengths", b.attention_mask.sum(1).tolist())
    a = CascadeAssistant([MaxGram()])
    t = time.perf_counter()
    out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
    print("time", time.perf_counter() - t, "calls", a.last_stats.target_calls)
    for s, x in enumerate(log):
        print(s, x)
