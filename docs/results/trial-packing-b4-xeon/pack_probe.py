"""How the decoder forward's time grows with query tokens at B rows (our kernels): is packing the real queries worth it?"""
import time, torch
from transformers import DynamicCache
from hf_cascade.bench.loading import load_model
from hf_cascade.backends.cpu.verify_linear import fast_verification
from hf_cascade.backends.cpu.kernels import TUNER
torch.set_num_threads(2)
model, tok = load_model(None)
dec = model.get_decoder()
H = model.config.hidden_size
def med(f, n=9):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[n // 2]
with torch.no_grad(), fast_verification(model):
    for B in (1, 4):
        T = 300
        ids = torch.randint(0, 1000, (B, T))
        cache = DynamicCache()
        dec(input_ids=ids, past_key_values=cache, use_cache=True)
        for N in (1, 2, 3, 4, 6, 8):
            def f():
                c = DynamicCache()
                for l, layer in enumerate(cache.layers):
                    c.update(layer.keys, layer.values, l)
                pos = torch.arange(T, T + N)[None].expand(B, N)
                dec(input_ids=torch.randint(0, 1000, (B, N)), position_ids=pos, past_key_values=c, use_cache=True)
            for _ in range(3): f()
            print(B, N, B * N, round(med(f) * 1e3, 1), "ms", flush=True)
    # linears alone, per M rows
    lin = [m for m in dec.modules() if isinstance(m, torch.nn.Linear)]
    for M in (1, 4, 8, 12, 16, 24, 32):
        x = {l.in_features: torch.randn(M, l.in_features) for l in lin}
        def g():
            for l in lin: l(x[l.in_features])
        for _ in range(5): g()
        print("linears M", M, round(med(g) * 1e3, 2), "ms", flush=True)
