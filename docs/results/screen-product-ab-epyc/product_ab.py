"""A/B of the argmax screen's product (float32 or integer, AVX512-VNNI) in one process, interleaved per prompt (order
reversed every other prompt): ``CascadeAssistant([MaxGram()])`` with its defaults, greedy, Spec-Bench
``--per-category`` prompts per category, 128 new tokens. The product is normally timed once per process
(``_faster_product`` in ``hf_cascade/backends/cpu/argmax_screen.py``); here it is set before every call.

    .venv/bin/python docs/results/screen-product-ab-epyc/product_ab.py [--per-category N] > LOG
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

import torch

from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.backends.cpu import argmax_screen, verify_head
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.bench.runner import encode

parser = argparse.ArgumentParser()
parser.add_argument("--per-category", type=int, default=1)
args = parser.parse_args()
ARMS = ("float", "integer")
torch.set_num_threads(2)
model, tok = load_model(None)
prompts = load_prompts(None, args.per_category)


def run(ids, product):
    for key, (version, _) in list(argmax_screen._SCREENS.items()):
        if key in built:
            argmax_screen._SCREENS[key] = (version, built[key][product])
    a = CascadeAssistant([MaxGram()])
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=128,
                         assistant_model=a, pad_token_id=tok.eos_token_id)
    seconds = time.perf_counter() - t0
    phases[product].update(a.last_stats.phase_seconds)
    return out[0, ids.shape[1]:].tolist(), seconds


phases = {p: Counter() for p in ARMS}
built = {}
warm, _ = encode(tok, prompts[0])
run(warm[:, :32], "float")
print("this process's own choices:", verify_head.calibrated_block_rows(), argmax_screen.screen_choices())
for key, (_, screen) in argmax_screen._SCREENS.items():          # one screen per product, the same decisions
    built[key] = {p: argmax_screen.ArgmaxScreen(screen.weight, p) for p in ARMS}
    for made in built[key].values():
        made.faster = dict(screen.faster)
phases = {p: Counter() for p in ARMS}
times = {p: [] for p in ARMS}
for i, prompt in enumerate(prompts):
    ids, _ = encode(tok, prompt)
    outs = {}
    for p in (ARMS if i % 2 == 0 else ARMS[::-1]):
        outs[p], seconds = run(ids, p)
        times[p].append(seconds)
    assert outs["float"] == outs["integer"], f"prompt {i}: outputs differ between products"
    print(prompt.get("category"), {p: round(times[p][-1], 2) for p in ARMS}, flush=True)

rng = random.Random(0)
n = len(prompts)
boots = sorted(sum(times["integer"][j] for j in idx) / sum(times["float"][j] for j in idx)
               for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(2000)))
print(f"integer / float time: {sum(times['integer']) / sum(times['float']):.3f} ({boots[50]:.3f}-{boots[1949]:.3f})")
for p in ARMS:
    print(f"{p}: seconds per phase", {k: round(v, 2) for k, v in phases[p].items()})
print(f"outputs identical across products: {n}/{n}")
