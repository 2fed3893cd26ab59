import torch
from hf_cascade.backends.cpu.argmax_screen import ArgmaxScreen
from hf_cascade.timing import interleaved_medians
torch.set_num_threads(2)
W = torch.randn(262144, 640) * 0.05
fs, vs = ArgmaxScreen(W, "float"), ArgmaxScreen(W, "integer")
with torch.inference_mode():
    for m in (1, 2, 3, 4, 5, 6, 8, 9, 16):
        x = torch.randn(m, 640) * 3
        r = interleaved_medians({"float": lambda: fs.screen_logits(x), "integer": lambda: vs.screen_logits(x)}, 21, warmup=2, alternate=True)
        print(m, {k: round(v * 1e3, 2) for k, v in r.items()}, flush=True)
