import time, torch
from hf_cascade.models import load_default_target
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.backends.cpu.panel import extension
torch.set_num_threads(2)
model, tok = load_default_target()
W = model.lm_head.weight.detach()
s = ArgmaxScreen(W)
ext = extension()
def med(f, reps=9):
    ts = []
    for r in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(ts[len(ts)//2] * 1e3, 1)
with torch.inference_mode():
    for m in (1, 4, 8):
        x = torch.randn(m, 640) * 50
        norm = (x.norm(dim=1) * 1.0001).contiguous()
        y = ext.panel_linear_i8(x, s.panels, s.scale, W.shape[0])
        print(m, "screen", med(lambda: s(x)), "i8", med(lambda: ext.panel_linear_i8(x, s.panels, s.scale, W.shape[0])),
              "cand", med(lambda: ext.screen_candidates(y, norm, s.margin, 1)), "head", med(lambda: torch.nn.functional.linear(x, W).argmax(-1)),
              "ncand", s.candidates)
