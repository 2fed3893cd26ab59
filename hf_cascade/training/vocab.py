"""Reduced draft vocabularies, FR-Spec style (Zhao et al., 2025, "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling", Section 3).

A drafter that predicts over the ``N`` most frequent target tokens instead of all ``V`` pays
``N/V`` of the output projection. FR-Spec counts frequencies on a large general corpus; we count them
on the distillation data (the target's own responses, weighted up, plus the training prompts), which
is what the drafter will be asked to predict. Slots left when fewer than ``N`` distinct tokens were
seen are filled with the lowest unseen ids (deviation: byte-level BPE vocabularies such as Gemma's
put frequent merges first, a better prior than nothing). Special tokens (BOS/EOS/PAD) are always in.

Verification is untouched: the drafter's ``q`` is a full-vocabulary distribution that is zero
outside the subset, so greedy output stays exact and sampling stays lossless.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from .store import DistillStore


def token_counts(store: DistillStore, vocab_size: int, response_weight: int = 4) -> np.ndarray:
    """Occurrences of each token id in ``store`` (``[vocab_size]`` int64); response tokens count
    ``response_weight`` times (they are what a drafter predicts), prompt tokens once."""
    tokens = store.tokens()
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.int64)
    if response_weight > 1:
        resp = np.zeros(len(tokens), dtype=bool)
        for r in store.records:
            resp[r.offset + r.prompt_len : r.offset + r.length] = True
        counts += (response_weight - 1) * np.bincount(tokens[resp], minlength=vocab_size)
    return counts[:vocab_size]


def frequent_subset(counts: np.ndarray, n: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``n`` most frequent token ids (``always`` included first), sorted ascending: ``[n]``."""
    vocab_size = counts.shape[0]
    if not 0 < n <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {n}")
    chosen = list(dict.fromkeys(int(t) for t in always if 0 <= int(t) < vocab_size))
    taken = np.zeros(vocab_size, dtype=bool)
    taken[chosen] = True
    # by count (descending), ties and unseen tokens by id (ascending)
    order = np.lexsort((np.arange(vocab_size), -counts))
    for t in order:
        if len(chosen) >= n:
            break
        if not taken[t]:
            chosen.append(int(t))
            taken[t] = True
    return torch.tensor(sorted(chosen[:n]), dtype=torch.long)


def coverage(counts: np.ndarray, subset: torch.Tensor) -> float:
    """Fraction of counted occurrences whose token is in ``subset``."""
    total = counts.sum()
    return float(counts[subset.numpy()].sum() / total) if total else 0.0
