import sys, time, torch, statistics, json
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
bs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
batches = make_batches(tok, load_prompts(None, 3), bs)
def run(b):
    a = CascadeAssistant([MaxGram()])
    t = time.perf_counter()
    out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=128, pad_token_id=0)
    return out, time.perf_counter() - t, a.last_stats
def pk(b):
    with hf_cascade.cpu_kernels(model):
        t = time.perf_counter()
        out = model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=128, pad_token_id=0)
        return out, time.perf_counter() - t
pk(batches[0]); run(batches[0])
rat = []; recs = []
for i, b in enumerate(batches):
    ref, tpk = pk(b)
    out, dt, st = run(b)
    d = st.as_dict() if hasattr(st, "as_dict") else st.__dict__
    ph = {k: round(v, 2) for k, v in dict(st.phase_seconds).items()}
    rat.append(tpk / dt)
    print(f"batch {i} shape {tuple(b.input_ids.shape)} pk {tpk:.2f}s ours {dt:.2f}s x{tpk/dt:.2f} calls {st.target_calls} {'ok' if torch.equal(out, ref) else 'DIFF'} phases {ph} other {dt-sum(ph.values()):.2f}", flush=True)
    recs.append(dict(i=i, pk=tpk, ours=dt, phases=ph, calls=st.target_calls))
print("geomean", statistics.geometric_mean(rat))
json.dump(recs, open(f"phases_b{bs}.json", "w"))
