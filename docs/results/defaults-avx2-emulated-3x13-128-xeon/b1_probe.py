import time, torch, sys
from hf_cascade.models import load_default_target
from hf_cascade.backends.cpu import cpu_kernels
from transformers import DynamicCache
torch.set_num_threads(2)
model, tok = load_default_target()
model.eval()
B, T = 1, 300
ids = torch.randint(100, 20000, (B, T))
head = model.lm_head
def med(f, reps=9):
    ts = []
    for r in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts)//2] * 1e3
def dec(N):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.get_decoder()(input_ids=ids, use_cache=True, past_key_values=cache)
        x = torch.randint(100, 20000, (B, N))
        pos = torch.arange(T, T + N)[None].expand(B, N)
        def f():
            model.get_decoder()(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True)
            cache.crop(-N)
        return med(f)
def hd(N):
    h = torch.randn(N, 640)
    with torch.no_grad():
        return med(lambda: head(h))
print("stock", [("N%d" % N, round(dec(N), 1), round(hd(N), 1)) for N in (1, 2, 4, 6, 8)])
with cpu_kernels(model) as s:
    for _ in range(2):
        print("kernels", [("N%d" % N, round(dec(N), 1), round(hd(N), 1)) for N in (1, 2, 4, 6, 8)])
    if s.argmax_screen is not None:
        for N in (1, 4, 8):
            scr = s.argmax_screen(N)
            h = torch.randn(N, 640)
            print("screen", N, scr)
