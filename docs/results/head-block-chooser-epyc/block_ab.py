"""A/B of the output-head block chosen per step (``hf_cascade/core/blocks.py``) against fixed blocks, in one process,
interleaved per prompt (order reversed every other prompt): ``CascadeAssistant([MaxGram()])`` with its defaults, greedy,
Spec-Bench
``--per-category`` prompts per category, 128 new tokens. A fixed block is set by turning the chooser off and setting
the session's block. Outputs must not depend on the block.

    .venv/bin/python docs/results/head-block-chooser-epyc/block_ab.py [--per-category N] [--fixed 2,4,8] > LOG
    (the control run: --fixed pinned,4)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter

import torch

from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.backends.cpu import verify_head
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.bench.runner import encode
from hf_cascade.core import loop

parser = argparse.ArgumentParser()
parser.add_argument("--per-category", type=int, default=1)
parser.add_argument("--fixed", default="2,4,8", help="the fixed blocks compared with the chosen one; 'pinned': the "
                    "chooser running with its block pinned to the session's 4 (its bookkeeping alone)")
args = parser.parse_args()
ARMS = ("chosen", *(b if b == "pinned" else int(b) for b in args.fixed.split(",")))
torch.set_num_threads(2)
model, tok = load_model(None)
prompts = load_prompts(None, args.per_category)
choose = loop._block_chooser


def pinned(run):
    chooser = choose(run)
    if chooser is not None:
        observe = chooser.observe_step

        def observe_step(read, rows):
            observe(read, rows)
            chooser.block = chooser.initial
        chooser.observe_step = observe_step
    return chooser


def run(ids, arm):
    for key in list(verify_head._BLOCK_ROWS):
        verify_head._BLOCK_ROWS[key] = arm if isinstance(arm, int) else 4
    loop._block_chooser = {"chosen": choose, "pinned": pinned}.get(arm, lambda run: None)
    a = CascadeAssistant([MaxGram()])
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=128,
                         assistant_model=a, pad_token_id=tok.eos_token_id)
    seconds = time.perf_counter() - t0
    s = a.last_stats
    accept = s.phase_seconds["accept"]                         # where the head calls are: the block's own effect
    for phase, secs in s.phase_seconds.items():
        phases[arm][phase] += secs
    phases[arm]["target calls"] += s.target_calls
    phases[arm]["drafted tokens"] += sum(s.draft_len_per_call)
    return out[0, ids.shape[1]:].tolist(), (seconds, accept), sum(s.head_calls) / s.target_calls, list(s.head_blocks)


phases = {b: Counter() for b in ARMS}
warm, _ = encode(tok, prompts[0])
run(warm[:, :32], 4)                                           # calibrates once, then every call is set
phases = {b: Counter() for b in ARMS}
times = {b: [] for b in ARMS}
accepts = {b: [] for b in ARMS}
calls = {b: [] for b in ARMS}
blocks = Counter()
for i, p in enumerate(prompts):
    ids, _ = encode(tok, p)
    outs = {}
    for b in (ARMS if i % 2 == 0 else ARMS[::-1]):
        outs[b], (seconds, accept), hc, chosen = run(ids, b)
        times[b].append(seconds)
        accepts[b].append(accept)
        calls[b].append(hc)
        if b == "chosen":
            blocks.update(chosen)
    assert all(outs[b] == outs[ARMS[0]] for b in ARMS), f"prompt {i}: outputs differ between blocks"
    print(p.get("category"), {b: round(times[b][-1], 2) for b in ARMS}, {b: round(calls[b][-1], 2) for b in ARMS},
          flush=True)

rng = random.Random(0)
n = len(prompts)
print(f"blocks chosen (steps): {dict(sorted(blocks.items()))}")


def paired(xs, b):
    """Arm ``b``'s total over the chosen block's, with a 95% bootstrap interval over prompts."""
    boots = sorted(sum(xs[b][j] for j in idx) / sum(xs["chosen"][j] for j in idx)
                   for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(2000)))
    return f"{sum(xs[b]) / sum(xs['chosen']):.3f} ({boots[50]:.3f}-{boots[1949]:.3f})"


for b in ARMS:
    print(f"block {b}: total {sum(times[b]):.1f} s, time / chosen {paired(times, b)}; "
          f"accept phase {sum(accepts[b]):.2f} s, "
          f"/ chosen {paired(accepts, b)}; head calls per target call {statistics.mean(calls[b]):.2f}")
for b in ARMS:
    print(f"block {b}: seconds per phase, target calls, drafted tokens", {k: round(v, 2) for k, v in phases[b].items()})
print(f"outputs identical across blocks: {n}/{n}")
