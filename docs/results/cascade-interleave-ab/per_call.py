"""Per-call view of Max-Gram + corpus and the two cascades (maxgram_first / interleave, drafter-xs v2, cost_aware):
where the time per target call goes, the verification time by draft length and by emitted tokens, and the
drafter's proposed / accepted tokens. Greedy, 128 new tokens, prompts as in ab_interleave.py.

usage: python per_call.py TAKE [ARM,ARM,...]   (FIRST as in ab_interleave.py; default arms mg+corpus,cs+corpus,il+corpus)"""
import collections, os, sys, time
import numpy as np, torch
torch.set_num_threads(2)
from hf_cascade.bench.runner import encode, rotated
from hf_cascade.cascade.generator import CascadeCandidateGenerator

from ab_interleave import setup          # this folder's A/B script: the same target, prompts and arms

CALLS = []                      # (arm, draft length, accepted, verify seconds) of every timed target call
ARM = [None]
_review = CascadeCandidateGenerator.on_target_review


def on_target_review(self, seq, num_proposed, num_accepted, verify_seconds):
    if ARM[0] is not None and verify_seconds is not None:
        CALLS.append((ARM[0], num_proposed, num_accepted, verify_seconds))
    return _review(self, seq, num_proposed, num_accepted, verify_seconds)


CascadeCandidateGenerator.on_target_review = on_target_review
take = int(sys.argv[1])
arms = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mg+corpus", "cs+corpus", "il+corpus"]
model, tok, prompts, make = setup(take, int(os.environ.get("FIRST", 3)), [3, 10])
A = {n: make[n]() for n in arms}
warm = encode(tok, {"prompt": "Question: Hello\n\nAnswer:"})
for a in A.values():
    model.generate(input_ids=warm[0], attention_mask=warm[1], assistant_model=a, do_sample=False, max_new_tokens=32)
agg = {n: collections.Counter() for n in arms}
for i, p in enumerate(prompts):
    ids, mask = encode(tok, p)
    for n in rotated(arms, i):
        ARM[0] = n
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, assistant_model=A[n], do_sample=False, max_new_tokens=128)
        s, g = A[n].last_stats, agg[n]
        g["seconds"] += time.perf_counter() - t0
        g["calls"] += s.target_calls
        g["new"] += s.new_tokens
        g["draft_len"] += sum(s.draft_len_per_call)
        for ph in ("draft", "verify"):
            g[ph] += s.phase_seconds.get(ph, 0.0)
        for lv in s.levels:
            g[f"{lv.name} proposed"] += lv.tokens_proposed
            g[f"{lv.name} accepted"] += lv.tokens_accepted
            g[f"{lv.name} forwards"] += lv.forward_calls
ARM[0] = None
print(f"{len(prompts)} prompts (FIRST={os.environ.get('FIRST', 3)})")
for n, g in agg.items():
    c = g["calls"]
    levels = {k: v for k, v in g.items() if " " in k}
    print(f"{n:10s} {g['seconds']:.1f} s, {g['new'] / c:.2f} tok/call, ms per call: all {1000 * g['seconds'] / c:.1f}, "
          f"draft {1000 * g['draft'] / c:.2f}, verify {1000 * g['verify'] / c:.1f}; draft length {g['draft_len'] / c:.2f}; {levels}")
print("\nverification ms (median, calls) by draft length n")
print("n    " + "".join(f"{a:>16s}" for a in arms))
for k in range(13):
    cells = []
    for a in arms:
        v = [1000 * s for ar, n, _, s in CALLS if ar == a and n == k]
        cells.append(f"{np.median(v):8.1f} ({len(v):3d})" if v else f"{'-':>14s}")
    print(f"{k:<4d} " + "  ".join(cells))
print("\nverification ms (median, calls) by tokens emitted (accepted + 1)")
for e in range(1, 13):
    cells = []
    for a in arms:
        v = [1000 * s for ar, _, acc, s in CALLS if ar == a and acc + 1 == e]
        cells.append(f"{np.median(v):8.1f} ({len(v):3d})" if v else f"{'-':>14s}")
    print(f"{e:<4d} " + "  ".join(cells))
for a in arms:
    v = [1000 * s for ar, _, _, s in CALLS if ar == a]
    print(a, f"calls {len(v)}, mean {np.mean(v):.1f} ms, share with no draft {np.mean([n == 0 for ar, n, _, _ in CALLS if ar == a]):.3f}")
