"""One draw from a categorical distribution, the law of ``torch.multinomial(probs, 1)``, at a cost linear in the
vocabulary on every device.

On a CPU, ``torch.multinomial`` over a vocabulary of a few hundred thousand ids costs a sizeable fraction of a
small target's forward; every sampling step draws at least once (the bonus token) and drafters draw once per
drafted token. :func:`categorical` draws there by inverse transform sampling: a float64 cumulative sum, one
uniform scaled to the total, and a binary search for the first cumulative value above it, which picks index
``i`` with probability ``probs[i] / sum(probs)`` (a zero-probability index spans an empty interval and is never
picked). Elsewhere it calls ``torch.multinomial``. The random stream differs from ``torch.multinomial``'s, the
law does not. On a CPU the index is read once (a host value: free there); elsewhere nothing is read.
"""

from __future__ import annotations

import torch


def categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A 0-dim long tensor: one index of ``probs`` (``[V]``, non-negative, any positive total) drawn with
    probability proportional to its entry, on ``probs``' device."""
    if probs.dim() != 1:
        raise ValueError(f"probs must be [V], got {tuple(probs.shape)}")
    if probs.device.type != "cpu":
        return torch.multinomial(probs, 1, generator=generator)[0]
    cdf = probs.double().cumsum(0)
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=probs.device) * cdf[-1]
    i = torch.searchsorted(cdf, u, right=True)[0]
    if int(i) >= probs.shape[0]:        # u < total in exact arithmetic; rounding made them equal: the last mass
        i = probs.nonzero()[-1, 0]
    return i


__all__ = ["categorical"]
