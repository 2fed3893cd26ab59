"""The rule, in its forms: draft a token, or verify a node, where its expected accepted tokens pay for its cost.

**Chains** (a drafter proposing one path). CS Drafting's Max-Gram always proposes a fixed number of tokens (10,
Appendix B); where the target's forward grows with the tokens it verifies, a fixed lookahead that keeps being
rejected costs time. :class:`AdaptiveLookahead` (not in the paper) chooses the length ``k`` that maximises the
expected tokens per unit of reviewer time::

    E(k) = (1 - a^(k+1)) / (1 - a)      expected tokens per review (Leviathan et al., 2023, Eq. 1)
    k*   = argmax_k  E(k) / cost(k)     cost(k) = reviewer time for 1 + k tokens / time for 1 token

``a`` is the per-token acceptance rate, estimated online per *evidence bucket* (for Max-Gram: the length of the
suffix match that produced the draft) with a Beta prior; ``cost`` is a
:class:`~hf_cascade.core.payoff.cost.CostModel`. ``k* = 0`` means: do not draft, let the reviewer take a plain
step. :class:`ExpectedGainRule` is the same rule for a drafter that proposes one token at a time, as a floor on
its next token's acceptance.

**A drafter's own forwards**. :class:`DrafterPayoff`: whether consulting a neural drafter is expected to pay for
its forwards, at the generation's tokens per second so far.

**Trees** (Sequoia, Chen et al., 2024, Section 3.3: size the tree from the hardware's measured cost profile;
EAGLE-2, Li et al., 2024: keep the nodes of highest draft path probability):

1. a node's *path probability* (its own acceptance estimate times its ancestors', :func:`path_probabilities`)
   estimates the chance the target accepts it, so the expected accepted tokens of any ancestor-closed node set is
   the sum of its path probabilities (linearity; siblings are exclusive events, each counted with its own
   probability);
2. sorting nodes by path probability gives, for each size ``n``, the best ``n``-node set (a child never outranks
   its parent, so every prefix of the order is a tree) with expected gain ``G(n)``;
3. :func:`best_size` picks the ``n`` maximizing ``1 + G(n) - R * cost(n)``, ``R`` the generation's tokens per
   unit of cost so far: by Dinkelbach's argument, the per-step choice that maximizes the long-run tokens per unit
   of time, ``sum(1 + G) / sum(cost)``, once ``R`` is that optimum. :func:`keep_best` marks those nodes.

Not modelled: a step whose accepted path leaves the main path (an accepted CAPE sibling) may pay a second
output-head call (:mod:`hf_cascade.core.rows`). The decisions depend on the context and the past steps only (no
random draws), so greedy decoding stays exact and point-mass sampling stays lossless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .acceptance import AcceptanceCalibration
from .cost import CostModel, VerifyCost


@dataclass
class AdaptiveLookahead:
    """Chooses draft lengths from online acceptance estimates (see module docstring).

    Args:
        max_tokens: upper bound on ``k``.
        prior_accept, prior_strength: Beta prior on the per-token acceptance of a bucket
            (``bucket_priors[bucket]`` overrides ``prior_accept``).
        cost: the reviewer's :class:`CostModel`.
        adaptive: ``False`` reproduces the paper's fixed lookahead (always ``max_tokens``).
        explore_every: a bucket whose choice is ``k = 0`` still drafts ``explore_tokens`` every
            ``explore_every``-th time, so that an unlucky start does not silence it for good.
    """

    max_tokens: int = 10
    prior_accept: float = 0.5
    prior_strength: float = 4.0
    bucket_priors: dict[int, float] = field(default_factory=dict)
    cost: CostModel = field(default_factory=CostModel)
    adaptive: bool = True
    explore_every: int = 8
    explore_tokens: int = 2
    _accepted: dict[int, float] = field(default_factory=dict)
    _trials: dict[int, float] = field(default_factory=dict)
    _skips: dict[int, int] = field(default_factory=dict)

    def acceptance(self, bucket: int) -> float:
        prior = self.bucket_priors.get(bucket, self.prior_accept)
        s = self._accepted.get(bucket, 0.0) + prior * self.prior_strength
        t = self._trials.get(bucket, 0.0) + self.prior_strength
        return min(max(s / t, 1e-3), 0.999)

    def choose(self, bucket: int, available: int, limit: int | None = None, offset: int = 0) -> int:
        """Draft length for a draft of ``available`` tokens from ``bucket`` (at most ``limit``),
        appended after ``offset`` tokens that other drafters already put in the same review."""
        kmax = min(available, self.max_tokens if limit is None else min(limit, self.max_tokens))
        if kmax <= 0:
            return 0
        if not self.adaptive:
            return kmax
        a = self.acceptance(bucket)
        best_k, best = 0, 1.0  # k = 0: one token per plain step
        expected, base = 1.0, self.cost.cost(offset)
        for k in range(1, kmax + 1):
            expected += a**k
            value = expected * base / self.cost.cost(offset + k)
            if value > best:
                best_k, best = k, value
        if best_k == 0 and self.explore_every > 0:
            self._skips[bucket] = self._skips.get(bucket, 0) + 1
            if self._skips[bucket] % self.explore_every == 0:
                return min(self.explore_tokens, kmax)
        return best_k

    def observe(self, bucket: int, proposed: int, accepted: int) -> None:
        """Feedback from a review: ``accepted`` of ``proposed`` drafts were accepted (a prefix)."""
        if proposed <= 0:
            return
        trials = accepted + (1 if accepted < proposed else 0)
        self._accepted[bucket] = self._accepted.get(bucket, 0.0) + accepted
        self._trials[bucket] = self._trials.get(bucket, 0.0) + trials


@dataclass
class DrafterPayoff:
    """Whether a neural drafter's next consultation is expected to pay for its own forwards (our addition; not
    in CS Drafting, whose cost model counts the drafter's time only through a fixed cost coefficient).

    :class:`ExpectedGainRule` decides which drafted tokens pay for their *verification*; it sees a token's
    probability only after the forward that computed it. A consultation at *reach* ``r`` (the chance that the
    target reaches the drafter's first token: the product of the acceptance estimates of the draft before it)
    adds ``r * g`` expected tokens to the step and ``t_consult`` to its time. By Dinkelbach's argument (as in
    :func:`best_size`) it raises the generation's tokens per second ``R`` when::

        r * g  >=  R * t_consult        g = (accepted + s * prior) / (sum of reach + s)

    ``g``: the drafter's tokens the target accepted per unit of reach, over this generation's consultations;
    ``R``: tokens emitted per second of target steps and consultations so far; ``t_consult``: a consultation's
    measured time (its forwards, including catching up on the tokens accepted since the last one; plus the time
    its tokens add to the target's step where no cost rule sizes the draft: HSDDW). An accepted
    drafter token is worth ``1 / R`` seconds, not a whole target step: where the target emits ``T`` tokens per
    step anyway, a step's extra token saves ``1 / T`` of a step. Until both times are measured every
    consultation goes ahead; a refused one still goes ahead every ``explore_every``-th time, so that ``g``
    keeps learning (those cost at most ``1 / explore_every`` of what the refused consultations would have).
    The rule decides only what is drafted, never what is accepted.
    """

    prior: float = 0.5
    strength: float = 2.0
    explore_every: int = 8
    decay: float = 0.8
    _accepted: float = 0.0
    _reach: float = 0.0
    _consult_seconds: float | None = None
    _tokens: float = 0.0
    _seconds: float = 0.0
    _refused: int = 0

    def gain_per_reach(self) -> float:
        """``g``: the drafter's accepted tokens per unit of reach so far (shrunk toward ``prior``)."""
        return (self._accepted + self.strength * self.prior) / (self._reach + self.strength)

    def rate(self) -> float | None:
        """``R``: tokens emitted per second of measured steps and consultations (``None`` before a step)."""
        return self._tokens / self._seconds if self._tokens > 0 and self._seconds > 0 else None

    def worth(self, reach: float) -> bool:
        """Whether to consult the drafter at ``reach`` (counts a refusal toward the next exploration)."""
        rate = self.rate()
        if self._consult_seconds is None or rate is None:
            return True
        if reach * self.gain_per_reach() >= rate * self._consult_seconds:
            return True
        self._refused += 1
        return self.explore_every > 0 and self._refused % self.explore_every == 0

    def observe_consult(self, reach: float, seconds: float, surcharge: float = 0.0) -> None:
        """A consultation at ``reach`` that ran forwards for ``seconds`` (device time). ``surcharge``: what
        verifying its tokens added to the target's step, for a drafter whose draft length no cost rule sets
        (HSDDW's entropy window); it counts toward the consultation's cost, not again toward ``R``'s time
        (the step's time already holds it)."""
        self._reach += reach
        self._seconds += seconds
        cost = seconds + surcharge
        self._consult_seconds = (
            cost if self._consult_seconds is None else (self.decay * self._consult_seconds + (1 - self.decay) * cost)
        )

    def observe_verdict(self, accepted: int, emitted: int, step_seconds: float | None) -> None:
        """The target's step: ``accepted`` of the drafter's tokens accepted, ``emitted`` tokens in all (its own
        included), and the step's measured time (``None``: not measured, e.g. the prefill's step)."""
        self._accepted += accepted
        if step_seconds is not None:
            self._tokens += emitted
            self._seconds += step_seconds


@dataclass
class ExpectedGainRule:
    """The lookahead's rule for a drafter that proposes one token at a time: a further token, accepted
    with probability ``a`` once reached, is worth verifying while it does not lower ``E(n) / cost(n)``,
    i.e. while ``a >= threshold()``; as a floor on the drafter's probability ``p``, ``floor()``
    (``a = calibration(p)``, or ``a = p`` without a calibration).

    ``E(n) = 1 + sum_i prod_{j<=i} a_j`` (the target's bonus token included) over the acceptance
    estimates ``a_j`` of the ``n`` tokens in the draft; a token is reached when all before it are accepted.
    """

    cost: CostModel
    calibration: AcceptanceCalibration | None = None
    reach: float = 1.0
    expected: float = 1.0
    n: int = 0

    @classmethod
    def after(
        cls, accept: Sequence[float], cost: CostModel, calibration: AcceptanceCalibration | None = None
    ) -> ExpectedGainRule:
        """The rule for a draft that already holds tokens with acceptance estimates ``accept``."""
        rule = cls(cost, calibration)
        for a in accept:
            rule.extend(a)
        return rule

    def threshold(self) -> float:
        """Smallest ``a`` for which ``(E + reach * a) / cost(n + 1) >= E / cost(n)``."""
        if self.reach <= 0.0:
            return math.inf
        ratio = self.cost.cost(self.n + 1) / self.cost.cost(self.n)
        return self.expected * (ratio - 1.0) / self.reach

    def floor(self) -> float:
        """The threshold as a floor on the drafter's probability of its token (``> 1``: none pays)."""
        t = self.threshold()
        return self.calibration.floor(t) if self.calibration is not None else t

    def estimate(self, p: float) -> float:
        """Acceptance estimate of a token the drafter gave probability ``p``."""
        return self.calibration(p) if self.calibration is not None else p

    def extend(self, a: float) -> None:
        """A token with acceptance estimate ``a`` joins the draft."""
        self.reach *= a
        self.expected += self.reach
        self.n += 1


def path_probabilities(parents: Sequence[int], acceptance: Sequence[float]) -> list[float]:
    """Each node's path probability: its own acceptance estimate times its ancestors' (``parents``: node order,
    parents first, ``-1`` below the root; host values)."""
    path = [0.0] * len(acceptance)
    for i, parent in enumerate(parents):
        path[i] = acceptance[i] * (path[parent] if parent >= 0 else 1.0)
    return path


def best_size(gains: Sequence[float], cost: VerifyCost, rate: float) -> int:
    """``gains``: path probabilities sorted in decreasing order -> the ``m`` in ``0 .. len(gains)`` maximizing
    ``1 + sum(gains[:m]) - rate * cost(m)`` (ties: the smaller ``m``)."""
    rate, best, best_value, total = float(rate), 0, None, 0.0
    for m in range(len(gains) + 1):
        if m:
            total += float(gains[m - 1])
        value = (1.0 + total) - rate * float(cost(m))
        if best_value is None or value > best_value:
            best, best_value = m, value
    return best


def keep_best(path_probs: Sequence[float], cost: VerifyCost, rate: float) -> list[bool]:
    """Which nodes (node order) are among the :func:`best_size` most probable ones (ties: node order, so a parent,
    which precedes its children and is at least as probable, comes first); closed under ancestors."""
    keys = [(-p, i) for i, p in enumerate(path_probs)]
    order = sorted(range(len(path_probs)), key=keys.__getitem__)  # by (-path_probs[i], i)
    m = best_size([path_probs[i] for i in order], cost, rate)
    keep = [False] * len(path_probs)
    for i in order[:m]:
        keep[i] = True
    return keep


__all__ = ["AdaptiveLookahead", "DrafterPayoff", "ExpectedGainRule", "best_size", "keep_best", "path_probabilities"]
