"""Per batch, the cascade with and without lookups at idle steps: target calls, drafted calls, widths, tokens per
call, the neural level's forwards, wall time. Usage: trace_lookups.py BATCHES ROWS"""
import sys, time, torch
from collections import Counter
from hf_cascade.core.gate import DraftGate
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts, load_drafts, shipped_head, SHIPPED_HEADS
from hf_cascade.bench.batched import make_batches
from hf_cascade.bench.methods import build_method
torch.set_num_threads(2)
model, tok = load_default_target()
bs = int(sys.argv[2])
batches = make_batches(tok, load_prompts(None, 3), bs)
method = build_method("cascade", model, load_drafts([shipped_head(f) for f in SHIPPED_HEADS["cascade"]], model))
idling = DraftGate.idling
kw = dict(do_sample=False, max_new_tokens=128, pad_token_id=0)
for i in [int(x) for x in sys.argv[1].split(",")]:
    for v in ("lookups", "none", "lookups", "none"):
        DraftGate.idling = idling if v == "lookups" else property(lambda self: False)
        t = time.perf_counter()
        out, _ = method.run(batches[i].input_ids, batches[i].attention_mask, kw); st = method.assistant.last_stats
        dt = time.perf_counter() - t
        w = st.width_per_call
        fw = sum(l.forward_calls for r in st.rows for l in r.levels[:-1])
        acc = sum(sum(r.accepted_per_call) for r in st.rows)
        print(f"batch {i} {v:8s} {dt:.2f}s calls {st.target_calls} drafted {sum(x > 1 for x in w)} "
              f"widths {sorted(Counter(w).items())} accepted {acc} neural forwards {fw}", flush=True)
