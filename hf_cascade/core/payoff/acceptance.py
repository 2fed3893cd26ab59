"""What the target accepts of a drafter's tokens: :class:`AcceptanceCalibration`, the drafter's probabilities
calibrated online by the target's verdicts (every rule of :mod:`hf_cascade.core.payoff` that reads a drafter's
probability reads it through one)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass
class AcceptanceCalibration:
    """The target's acceptance rate of a drafter's token as a function of the drafter's probability
    ``p`` of it, learned online from the target's verdicts (our addition; not in CS Drafting)::

        a(p) = min(0.999, p * r_b)    b: p's bin;  r_b = (hits_b + s * r) / (sum_p_b + s)
        r    = (hits + s) / (sum_p + s)                       pooled over bins, shrunk toward 1

    A distilled drafter is overconfident away from its training data (``docs/design.md``, *Training drafters*), so
    ``p`` as the acceptance estimate admits tokens that do not pay for their verification. Until verdicts arrive
    ``a(p) = p``.
    """

    edges: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
    strength: float = 4.0
    _hits: list[float] = field(default_factory=list)
    _expected: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.edges) - 1
        self._hits = self._hits or [0.0] * n
        self._expected = self._expected or [0.0] * n

    def _bin(self, p: float) -> int:
        return min(max(bisect.bisect_right(self.edges, p) - 1, 0), len(self._hits) - 1)

    def _pooled(self) -> float:
        return (sum(self._hits) + self.strength) / (sum(self._expected) + self.strength)

    def ratio(self, b: int, pooled: float | None = None) -> float:
        pooled = self._pooled() if pooled is None else pooled
        return (self._hits[b] + self.strength * pooled) / (self._expected[b] + self.strength)

    def __call__(self, p: float) -> float:
        return min(0.999, p * self.ratio(self._bin(p)))

    def frozen(self):
        """``a`` as it stands, a function of ``p`` giving the values this object gives until its next
        :meth:`observe`, its bins' ratios computed once (for a caller asking for many ``p`` between two verdicts)."""
        pooled = self._pooled()
        ratios = [self.ratio(b, pooled) for b in range(len(self._hits))]
        edges, last = self.edges, len(ratios) - 1

        def a(p: float) -> float:  # min(0.999, p * ratios[min(max(bin, 0), last)]), as __call__
            b = bisect.bisect_right(edges, p) - 1
            if b < 0:
                b = 0
            elif b > last:
                b = last
            value = p * ratios[b]
            return value if value < 0.999 else 0.999

        return a

    def observe(self, p: float, accepted: bool) -> None:
        """A token the drafter gave probability ``p`` was reached by the target's review and accepted or not."""
        b = self._bin(p)
        self._hits[b] += float(accepted)
        self._expected[b] += p

    def floor(self, t: float) -> float:
        """Smallest ``p`` from which every higher probability maps to ``a(p) >= t`` (``inf``: none),
        scanning bins from the top; a floor on ``p`` keeps the drafting rule a plain threshold."""
        if t > 0.999:
            return math.inf
        floor, pooled = math.inf, self._pooled()
        for b in reversed(range(len(self._hits))):
            lo, hi = self.edges[b], self.edges[b + 1]
            need = t / self.ratio(b, pooled)  # within bin b, a(p) >= t  <=>  p >= need
            if need <= lo:
                floor = lo
                continue
            if need <= hi:
                floor = need
            break
        return floor


__all__ = ["AcceptanceCalibration"]
