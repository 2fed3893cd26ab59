import time, torch, sys
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.core import batch as BT
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
batches = make_batches(tok, load_prompts(None, 3), 4)
orig = BT.prefill_by_row
sel = [int(x) for x in sys.argv[1].split(",")]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 128
for bi in sel:
    b = batches[bi]
    with hf_cascade.cpu_kernels(model):
        ref = model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=n, pad_token_id=0)
    for mode in ("rows", "padded", "rows"):
        BT.prefill_by_row = orig if mode == "rows" else (lambda l, w: False)
        a = CascadeAssistant([MaxGram()])
        t = time.perf_counter(); out = model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=a, do_sample=False, max_new_tokens=n, pad_token_id=0); dt = time.perf_counter() - t
        print(bi, mode, orig([int(x) - 1 for x in b.attention_mask.sum(1)], b.input_ids.shape[1] - 1), f"{dt:.2f}s", "same" if torch.equal(out, ref) else "DIFF", a.last_stats.phase_seconds.get("prefill") if hasattr(a.last_stats, "phase_seconds") else "", flush=True)
