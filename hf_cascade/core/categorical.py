"""One draw from a categorical distribution, the law of ``torch.multinomial(probs, 1)``, at a cost linear in the
vocabulary on every device.

On a CPU, ``torch.multinomial`` over a vocabulary of a few hundred thousand ids costs a sizeable fraction of a
small target's forward; every sampling step draws at least once (the bonus token) and drafters draw once per
drafted token. :func:`categorical` draws there by inverse transform sampling: a float64 cumulative sum, one
uniform scaled to the total, and a binary search for the first cumulative value above it, which picks index
``i`` with probability ``probs[i] / sum(probs)`` (a zero-probability index spans an empty interval and is never
picked). Elsewhere it calls ``torch.multinomial``. The random stream differs from ``torch.multinomial``'s, the
law does not; nothing is read from the device.
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
    total = cdf[-1:]
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=probs.device) * total
    # u < total in exact arithmetic; should rounding make them equal, the largest double below it still falls in
    # the last interval with mass (the zero-mass ids after it share its cumulative value, and the search takes
    # the first index whose cumulative value exceeds u)
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True)[0]


__all__ = ["categorical"]
