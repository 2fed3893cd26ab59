"""Where the argmax screen's time goes at 1-8 rows, and how many candidates an int8 copy of the head would leave."""
import time, torch
from hf_cascade.bench.loading import load_model
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.backends.cpu.panel import extension
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.get_output_embeddings().weight.detach().float()
N, K = W.shape
scr = ArgmaxScreen(W)
ext = extension()
# real hidden rows
ids = tok("The quick brown fox jumps over the lazy dog. Write a python function that sorts a list of numbers and explain", return_tensors="pt").input_ids
with torch.no_grad():
    h = model.get_decoder()(input_ids=ids).last_hidden_state[0]       # [T, K]
def med(f, n=15):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[n // 2] * 1e3
for m in (1, 2, 4, 8):
    x = h[:m].contiguous()
    print(m, "kernel bf16", round(med(lambda: ext.panel_linear_bf16(x, scr.panels, N)), 2), "ms",
          "screen()", round(med(lambda: scr(x)), 2), "top50", round(med(lambda: scr.top(x, 50)), 2),
          "fp32 panel-less F.linear", round(med(lambda: torch.nn.functional.linear(x, W)), 2))
# int8 per-row absmax simulation
s = W.abs().amax(dim=1) / 127
q = torch.round(W / s[:, None]).clamp(-127, 127)
Wq = (q * s[:, None])
g = K * 2**-24 / (1 - K * 2**-24)
wd, wqd = W.double(), Wq.double()
c8 = ((wd - wqd).norm(dim=1) + g * (wd.norm(dim=1) + wqd.norm(dim=1)) + 2**-24 * wqd.norm(dim=1)) * 1.01
print("margin ratio int8/bf16 median", float((c8.float() / scr.margin).median()))
for i in range(0, h.shape[0], 3):
    x = h[i]
    sc = Wq @ x
    reach = x.norm() * 1.0001 * c8.float()
    low = sc - reach
    n1 = int((sc + reach >= low.max()).sum())
    n50 = int((sc + reach >= low.topk(50).values[-1]).sum())
    scb = ext.panel_linear_bf16(x[None].contiguous(), scr.panels, N)[0]
    rb = x.norm() * 1.0001 * scr.margin
    b1 = int((scb + rb >= (scb - rb).max()).sum()); b50 = int((scb + rb >= (scb - rb).topk(50).values[-1]).sum())
    print("row", i, "int8 cands argmax", n1, "top50", n50, "| bf16", b1, b50)
