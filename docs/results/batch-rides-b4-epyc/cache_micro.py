import time, torch, statistics
import hf_cascade
from transformers import DynamicCache
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from kvcache_tried import growing_cache
from hf_cascade.models import load_default_target
torch.set_num_threads(2)
model, tok = load_default_target()
for B, L in [(1, 200), (3, 746), (4, 1500), (1, 1500)]:
    ids = torch.randint(10, 1000, (B, L))
    res = {}
    with hf_cascade.cpu_kernels(model), torch.no_grad():
        for name, make in [("cat", DynamicCache), ("grow", growing_cache)] * 2:
            cache = make()
            model(ids, past_key_values=cache, use_cache=True)
            x = torch.randint(10, 1000, (B, 1)); ts = []
            for s in range(40):
                t = time.perf_counter()
                model(x, past_key_values=cache, use_cache=True, logits_to_keep=1)
                ts.append(time.perf_counter() - t)
            res[name] = statistics.median(ts[5:]) * 1000
        print(B, L, {k: round(v, 1) for k, v in res.items()}, flush=True)
