import time, torch
from hf_cascade.bench.loading import load_model
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.backends.cpu.panel import extension
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.get_output_embeddings().weight.detach().float()
N, K = W.shape
ext = extension()
t = time.perf_counter(); q, s = ext.pack_panels_i8(W); print("pack i8", round(time.perf_counter() - t, 2), "s", q.shape, s.shape)
bf = ext.pack_panels_bf16(W)
# correctness: dequantized product
P = q.shape[0]
deq = (q.float() * s.view(P, 1, 16)).transpose(1, 2).reshape(P * 16, K)[:N]
x = torch.randn(3, K)
y = ext.panel_linear_i8(x, q, s, N)
print("max err vs deq", float((y - x @ deq.T).abs().max()), "vs W", float((y - x @ W.T).abs().max()))
def med(f, n=15):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[n // 2] * 1e3
for m in (1, 2, 3, 4, 8, 16):
    x = torch.randn(m, K)
    print(m, "bf16", round(med(lambda: ext.panel_linear_bf16(x, bf, N)), 2), "i8", round(med(lambda: ext.panel_linear_i8(x, q, s, N)), 2), flush=True)
