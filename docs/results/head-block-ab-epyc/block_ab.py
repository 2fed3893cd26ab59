"""A/B of the CPU backend's output-head block (rows per head or screen call), in one process, interleaved per prompt:
Max-Gram with its defaults, greedy, Spec-Bench 1 prompt per category, 128 new tokens. The block is normally timed
once per process (``calibrate_block_rows``); here it is set before every call. Outputs must not depend on it.

    .venv/bin/python docs/results/head-block-ab-epyc/block_ab.py > docs/results/head-block-ab-epyc/block_ab.log
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from hf_cascade import CascadeAssistant, MaxGram
from hf_cascade.backends.cpu import verify_head
from hf_cascade.bench.loading import load_model, load_prompts
from hf_cascade.bench.runner import encode

BLOCKS = (2, 4, 8)
torch.set_num_threads(2)
model, tok = load_model(None)
prompts = load_prompts(None, 1)


def run(ids, block):
    for key in list(verify_head._BLOCK_ROWS):
        verify_head._BLOCK_ROWS[key] = block
    a = CascadeAssistant([MaxGram()])
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=128,
                         assistant_model=a, pad_token_id=tok.eos_token_id)
    seconds = time.perf_counter() - t0
    s = a.last_stats
    return out[0, ids.shape[1]:].tolist(), seconds, sum(s.head_calls) / s.target_calls


warm, _ = encode(tok, prompts[0])
run(warm[:, :32], 4)                                           # calibrates once, then every call is set
print("calibrated in this process:", verify_head.calibrated_block_rows())
times = {b: [] for b in BLOCKS}
calls = {b: [] for b in BLOCKS}
for i, p in enumerate(prompts):
    ids, _ = encode(tok, p)
    outs = {}
    for b in (BLOCKS if i % 2 == 0 else BLOCKS[::-1]):
        outs[b], seconds, hc = run(ids, b)
        times[b].append(seconds)
        calls[b].append(hc)
    assert all(outs[b] == outs[BLOCKS[0]] for b in BLOCKS), f"prompt {i}: outputs differ between blocks"
    print(p.get("category"), {b: round(times[b][-1], 2) for b in BLOCKS}, {b: round(calls[b][-1], 2) for b in BLOCKS})

rng = random.Random(0)
n = len(prompts)
for b in BLOCKS:
    ratio = sum(times[b]) / sum(times[4])
    boots = sorted(sum(times[b][j] for j in idx) / sum(times[4][j] for j in idx)
                   for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(2000)))
    print(f"block {b}: total {sum(times[b]):.1f} s, time / block 4 {ratio:.3f} ({boots[50]:.3f}-{boots[1949]:.3f}), "
          f"head calls per target call {statistics.mean(calls[b]):.2f}")
print(f"outputs identical across blocks: {n}/{n}")
