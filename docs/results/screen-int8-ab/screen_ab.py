"""In-process A/B of the argmax screen's copy: bfloat16 (HEAD's kernel, built under another name) vs int8 (working tree).
# old_panel_linear.cpp: git show 413650c:hf_cascade/backends/cpu/csrc/panel_linear.cpp > old_panel_linear.cpp
argv: B per_cat mode(greedy|t07|t10) strategies(comma: maxgram,cascade,...)"""
import sys, time, os, torch
from torch.utils.cpp_extension import load
from hf_cascade.bench.loading import load_model, load_prompts, shipped_head
from hf_cascade.bench.batched import make_batches
from hf_cascade.bench.config import BenchConfig
from hf_cascade.bench.runner import generation_kwargs, rotated
from hf_cascade.backends.cpu import cpu_kernels
from hf_cascade.backends.cpu import argmax_screen as A
from hf_cascade import CascadeAssistant, MaxGram
torch.set_num_threads(2)
old_ext = load("hf_cascade_panel_old_bf16", ["old_panel_linear.cpp"], extra_cflags=["-O3", "-march=native", "-fopenmp"],
               extra_ldflags=["-fopenmp"], verbose=False)

class OldScreen(A.ArgmaxScreen):
    def __init__(self, weight):
        self.weight = weight
        self.panels = old_ext.pack_panels_bf16(weight.contiguous())
        n, k = weight.shape
        g = k * A._U / (1 - k * A._U)
        margin = []
        for rows in weight.split(16384):
            w, rounded = rows.double(), rows.to(torch.bfloat16).double()
            margin.append((w - rounded).norm(dim=1) + g * (w.norm(dim=1) + rounded.norm(dim=1)))
        self.margin = (torch.cat(margin) * 1.01).float()
        self.candidates = 0
        self.faster = {}
    def _candidates(self, x, k):
        x = x.float().contiguous()
        screen = old_ext.panel_linear_bf16(x, self.panels, self.weight.shape[0])
        reach = (x.norm(dim=1, keepdim=True) * 1.0001) * self.margin
        low = screen - reach
        k = min(int(k), low.shape[1])
        floor = low.max(dim=1, keepdim=True).values if k == 1 else low.topk(k, dim=1).values[:, -1:]
        maybe = screen + reach >= floor
        rows = []
        for row, mask in zip(x, maybe):
            ids = mask.nonzero().flatten()
            self.candidates += ids.numel()
            rows.append((ids, torch.nn.functional.linear(row[None], self.weight.index_select(0, ids))[0]))
        return x, rows

size, per_cat, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
strategies = sys.argv[4].split(",")
model, tok = load_model(None)
cfg = BenchConfig() if mode == "greedy" else BenchConfig(sampling=True, temperature=0.7 if mode == "t07" else 1.0)
kw = generation_kwargs(cfg, tok)
W = model.get_output_embeddings().weight
screens = {"old": OldScreen(W), "new": A.ArgmaxScreen(W)}
prompts = load_prompts(None, per_cat)
batches = make_batches(tok, prompts, size)
from hf_cascade.bench.loading import SHIPPED_HEADS, load_drafts
drafts = {s: load_drafts([shipped_head(f) for f in SHIPPED_HEADS[s]]) for s in strategies if s in SHIPPED_HEADS}
def make(s):
    if s == "maxgram":
        return CascadeAssistant([MaxGram()])
    from hf_cascade.bench.methods import build_method
    return build_method(s, model, drafts.get(s, []), sampling=cfg.sampling).assistant
names = ["plain-kernels"] + [f"{s}-{v}" for s in strategies for v in ("old", "new")]
def run(name, b, seed):
    if seed is not None:
        torch.manual_seed(seed)
    if name == "plain-kernels":
        with cpu_kernels(model):
            return model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
    s, v = name.rsplit("-", 1)
    A._SCREENS[id(W)] = (W._version, screens[v])
    return model.generate(b.input_ids, attention_mask=b.attention_mask, assistant_model=make(s), **kw)
for n in names: run(n, batches[0], 0)
res = {n: [] for n in names}; toks = {n: 0 for n in names}
for i, b in enumerate(batches):
    outs = {}
    for n in rotated(names, i):
        t = time.perf_counter(); outs[n] = run(n, b, i if cfg.sampling else None); res[n].append(time.perf_counter() - t)
        toks[n] += int((outs[n][:, b.input_ids.shape[1]:] != tok.pad_token_id).sum())
    same = {n: outs[n].tolist() == outs["plain-kernels"].tolist() for n in names}
    print(i, {n: round(res["plain-kernels"][-1] / res[n][-1], 3) for n in names}, all(same.values()) if mode == "greedy" else "", flush=True)
pk = sum(res["plain-kernels"]) / toks["plain-kernels"]
print("total (time per token vs plain-kernels)", {n: round(pk / (sum(res[n]) / toks[n]), 3) for n in names})
print("screens faster:", {v: s.faster for v, s in screens.items()})
