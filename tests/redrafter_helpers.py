"""ReDrafter heads for the tiny test targets, trained in-process in a second or two.

:func:`fit_head` distils a target's greedy continuations of random prompts into a small
:class:`~hf_cascade.heads.ReDrafterModel` with :func:`hf_cascade.training.redrafter.redrafter_loss`
(the real training loss), so the decoding tests see drafts that are often, but not always, right.
Heads are cached per (target, settings) for the session.
"""

from __future__ import annotations

import torch

from hf_cascade import ReDrafterConfig, ReDrafterModel

# the head fitter lives in the package (``hf-cascade bench --overhead`` runs ReDrafter on the tiny target too)
from hf_cascade.bench.tiny import _HEADS, batch_of, continuations, fit_head  # noqa: F401


def random_head(target, seed: int = 0, layers: int = 1) -> ReDrafterModel:
    """An untrained head for ``target`` (its drafts are mostly rejected)."""
    tc = target.config.get_text_config()
    torch.manual_seed(seed)
    return ReDrafterModel(
        ReDrafterConfig(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, num_draft_layers=layers)
    ).eval()
