import time, torch
from hf_cascade.bench.loading import load_model
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.backends.cpu.panel import extension
torch.set_num_threads(2)
model, tok = load_model(None)
W = model.get_output_embeddings().weight.detach()
scr = ArgmaxScreen(W); ext = extension(); N = W.shape[0]
ids = tok("The quick brown fox jumps over the lazy dog. Write a python function that sorts a list", return_tensors="pt").input_ids
with torch.no_grad():
    h = model.get_decoder()(input_ids=ids).last_hidden_state[0]
def med(f, n=21):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(ts[n // 2] * 1e3, 2)
def old_cands(x, k):
    screen = ext.panel_linear_i8(x, scr.panels, scr.scale, N)
    reach = (x.norm(dim=1, keepdim=True) * 1.0001) * scr.margin
    low = screen - reach
    floor = low.max(dim=1, keepdim=True).values if k == 1 else low.topk(k, dim=1).values[:, -1:]
    return [m.nonzero().flatten() for m in (screen + reach >= floor)]
for m in (1, 4):
    x = h[:m].contiguous()
    y = ext.panel_linear_i8(x, scr.panels, scr.scale, N)
    norm = (x.norm(dim=1) * 1.0001).contiguous()
    for k in (1, 50):
        a = [t.tolist() for t in old_cands(x, k)]; b = [t.tolist() for t in ext.screen_candidates(y, norm, scr.margin, k)]
        print(m, k, "kernel", med(lambda: ext.panel_linear_i8(x, scr.panels, scr.scale, N)),
              "kernel+torch select", med(lambda: old_cands(x, k)), "kernel+fused", med(lambda: ext.screen_candidates(ext.panel_linear_i8(x, scr.panels, scr.scale, N), norm, scr.margin, k)),
              "screen() / top()", med(lambda: scr(x) if k == 1 else scr.top(x, k)), "same sets", a == b, [len(t) for t in b])
