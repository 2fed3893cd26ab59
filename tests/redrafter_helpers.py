"""ReDrafter heads for the tiny test targets, trained in-process in a second or two.

:func:`fit_head` distils a target's greedy continuations of random prompts into a small
:class:`~hf_cascade.heads.ReDrafterModel` with :func:`hf_cascade.training.redrafter.redrafter_loss`
(the real training loss), so the decoding tests see drafts that are often, but not always, right.
Heads are cached per (target, settings) for the session.
"""

from __future__ import annotations

import torch

from hf_cascade import ReDrafterConfig, ReDrafterModel
from hf_cascade.training.loop import Batch
from hf_cascade.training.redrafter import redrafter_loss
from tests import tiny_models as tm

_HEADS: dict = {}


def continuations(target, n: int = 24, new: int = 24, seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` (sequence, prompt length) pairs: random prompts of 1-6 tokens and the target's greedy
    continuation (``new`` tokens, or up to its EOS)."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.get_text_config().vocab_size
    out = []
    with torch.no_grad():
        for _ in range(n):
            plen = int(torch.randint(1, 7, (1,), generator=g))
            prompt = [tm.BOS] + torch.randint(4, vocab, (plen,), generator=g).tolist()
            seq = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new)[0].tolist()
            out.append((seq, len(prompt)))
    return out


def batch_of(sequences) -> Batch:
    width = max(len(s) for s, _ in sequences)
    ids = torch.full((len(sequences), width), tm.PAD, dtype=torch.long)
    weights = torch.zeros(len(sequences), width)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (s, plen) in enumerate(sequences):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
        weights[b, 1 : len(s)] = 0.1
        weights[b, plen : len(s)] = 1.0
    return Batch(ids, weights, mask, list(range(len(sequences))))


def fit_head(target, key: str, steps: int = 150, L: int = 4, layers: int = 1, seed: int = 0,
             draft_vocab_size: int | None = None) -> ReDrafterModel:
    """A ReDrafter head for ``target`` trained for ``steps`` full-batch steps (cached by ``key``)."""
    cache_key = (key, steps, L, layers, seed, draft_vocab_size)
    if cache_key in _HEADS:
        return _HEADS[cache_key]
    tc = target.config.get_text_config()
    torch.manual_seed(seed)
    head = ReDrafterModel(ReDrafterConfig(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
                                          num_draft_layers=layers, draft_vocab_size=draft_vocab_size))
    if draft_vocab_size is not None:
        head.set_vocab_subset(torch.arange(draft_vocab_size))
    batch = batch_of(continuations(target, seed=seed))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    head.train()
    for _ in range(steps):
        loss, _ = redrafter_loss(head, target, batch, L=L)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval().requires_grad_(False)
    _HEADS[cache_key] = head
    return head


def random_head(target, seed: int = 0, layers: int = 1) -> ReDrafterModel:
    """An untrained head for ``target`` (its drafts are mostly rejected)."""
    tc = target.config.get_text_config()
    torch.manual_seed(seed)
    return ReDrafterModel(ReDrafterConfig(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
                                          num_draft_layers=layers)).eval()
