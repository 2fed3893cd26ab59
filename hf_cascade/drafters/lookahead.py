"""Adaptive draft length: propose only as many tokens as pay for their verification.

CS Drafting's Max-Gram always proposes a fixed number of tokens (10, Appendix B). On a CPU the
target's forward grows with the number of tokens verified, so a fixed lookahead that keeps being
rejected costs time. :class:`AdaptiveLookahead` (our deviation from the paper) chooses the length
``k`` that maximises the expected tokens per unit of reviewer time::

    E(k) = (1 - a^(k+1)) / (1 - a)      expected tokens per review (Leviathan et al., Eq. 1)
    k*   = argmax_k  E(k) / cost(k)     cost(k) = reviewer time for 1 + k tokens / time for 1 token

``a`` is the per-token acceptance rate, estimated online per *evidence bucket* (for Max-Gram: the
length of the suffix match that produced the draft) with a Beta prior; ``cost`` is measured online
from the reviewer's own forward times (:class:`CostModel`), or fixed for deterministic tests.
``k* = 0`` means: do not draft, let the reviewer take a plain step.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class CostModel:
    """Relative cost of one review of ``k`` drafts, ``cost(k) = t(k) / t(0)``.

    With ``measure=True`` the reviewer's forward times are recorded by :meth:`observe` and averaged
    (exponential moving average per ``k``); ``prior_slope``/``prior_step`` describe the curve until
    a ``k`` has been measured: ``cost(k) = 1 + prior_step * [k > 0] + prior_slope * k``.

    The seconds given to :meth:`observe` must be device time: on an accelerator kernels run
    asynchronously, so whoever times a forward synchronises the device before reading the clock, at
    both ends (:func:`hf_cascade.placement.synchronize`; ``NeuralLevel.scores(..., timed=True)`` does).
    """

    prior_step: float = 0.6
    prior_slope: float = 0.05
    measure: bool = True
    decay: float = 0.8
    _seconds: dict[int, float] = field(default_factory=dict)
    _costs: dict[tuple[int, float, float], float] = field(default_factory=dict, repr=False, compare=False)

    def observe(self, k: int, seconds: float) -> None:
        if not self.measure:
            return
        old = self._seconds.get(k)
        self._seconds[k] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        self._costs.clear()

    def cost(self, k: int) -> float:
        """``cost(k)``, remembered until the next :meth:`observe` (the drafting rules ask for the same
        few ``k`` many times per draft)."""
        key = (k, self.prior_step, self.prior_slope)
        value = self._costs.get(key)
        if value is None:
            value = self._costs[key] = self._cost(k)
        return value

    def _cost(self, k: int) -> float:
        prior = 1.0 + self.prior_step * (k > 0) + self.prior_slope * k
        base = self._seconds.get(0)
        if base is None or base <= 0:
            return prior
        measured = self._seconds.get(k)
        if measured is None:
            # Interpolate from the nearest measured k, scaled by the prior's shape.
            known = [j for j in self._seconds if j > 0]
            if not known or k == 0:
                return prior
            j = min(known, key=lambda j: abs(j - k))
            jprior = 1.0 + self.prior_step + self.prior_slope * j
            return max(1.0, (self._seconds[j] / base) * prior / jprior)
        return max(1.0, measured / base) if k else 1.0


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
class AcceptanceCalibration:
    """The target's acceptance rate of a drafter's token as a function of the drafter's probability
    ``p`` of it, learned online from the target's verdicts (our addition; not in CS Drafting)::

        a(p) = min(0.999, p * r_b)    b: p's bin;  r_b = (hits_b + s * r) / (sum_p_b + s)
        r    = (hits + s) / (sum_p + s)                       pooled over bins, shrunk toward 1

    A distilled drafter is overconfident away from its training data: on Spec-Bench, the first drafter-xs's
    tokens with p in [0.3, 0.8) match the target 19-36% of the time (teacher-forced on the target's
    own outputs), so ``p`` as the acceptance estimate admits tokens that do not pay for their
    verification. Until verdicts arrive ``a(p) = p``.
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
            need = t / self.ratio(b, pooled)         # within bin b, a(p) >= t  <=>  p >= need
            if need <= lo:
                floor = lo
                continue
            if need <= hi:
                floor = need
            break
        return floor


@dataclass
class DrafterPayoff:
    """Whether a neural drafter's next consultation is expected to pay for its own forwards (our addition; not
    in CS Drafting, whose cost model counts the drafter's time only through a fixed cost coefficient).

    :class:`ExpectedGainRule` decides which drafted tokens pay for their *verification*; it sees a token's
    probability only after the forward that computed it. A consultation at *reach* ``r`` (the chance that the
    target reaches the drafter's first token: the product of the acceptance estimates of the draft before it)
    adds ``r * g`` expected tokens to the step and ``t_consult`` to its time. By Dinkelbach's argument (as in
    :func:`~hf_cascade.core.budget.best_size`) it raises the generation's tokens per second ``R`` when::

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
        self._consult_seconds = cost if self._consult_seconds is None else (
            self.decay * self._consult_seconds + (1 - self.decay) * cost)

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
    def after(cls, accept: Sequence[float], cost: CostModel,
              calibration: AcceptanceCalibration | None = None) -> "ExpectedGainRule":
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
