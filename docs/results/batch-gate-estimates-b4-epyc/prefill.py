import time, torch, statistics
import hf_cascade
from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.models import load_default_target
from hf_cascade.bench.loading import load_prompts
from hf_cascade.bench.batched import make_batches
torch.set_num_threads(2)
model, tok = load_default_target()
batches = make_batches(tok, load_prompts(None, 3), 4)
for bi in (7, 6):
    b = batches[bi]
    for rep in range(2):
        with hf_cascade.cpu_kernels(model):
            t = time.perf_counter(); model.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False, max_new_tokens=2, pad_token_id=0); tpk = time.perf_counter() - t
        t = time.perf_counter(); model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=CascadeAssistant([MaxGram()]), do_sample=False, max_new_tokens=2, pad_token_id=0); tours = time.perf_counter() - t
        print(bi, b.input_ids.shape, f"pk {tpk:.2f}s ours {tours:.2f}s", flush=True)
